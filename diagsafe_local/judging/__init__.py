"""Judging: rubric registry (ours and the published JSON-output judges) and the batched judge step."""

from diagsafe_local.judging import published, rubrics  # noqa: F401  (registration)
