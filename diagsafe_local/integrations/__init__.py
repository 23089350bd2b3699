"""Integrations with the tools a training run already uses (a `transformers.Trainer` callback)."""
