"""Reference-based and string metrics, each an entry of `METRICS` (heavy libraries load on first use)."""

from diagsafe_local.metrics import embedding, keywords, lexical, meteor, rouge, tfidf  # noqa: F401  (registration)
from diagsafe_local.metrics.base import METRICS, MetricSpec, TextPair, compute_metrics

__all__ = ["METRICS", "MetricSpec", "TextPair", "compute_metrics"]
