"""diagsafe-local: offline harmfulness evaluation of LLM checkpoints, and the HarmMetric Eval benchmark."""

__version__ = "0.1.0"
