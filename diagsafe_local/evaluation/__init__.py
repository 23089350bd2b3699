"""The checkpoint evaluation: items -> answers (turn by turn) -> verdicts -> run directory -> summary, report, gate."""
