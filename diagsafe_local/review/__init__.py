"""Reviewing a run by people: browse every answer (`view`), label a sample of them (`label`), validate the run's
judge on those labels (`validate --format run`), and export the run for Inspect View (`export`)."""
