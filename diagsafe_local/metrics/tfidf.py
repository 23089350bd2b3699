"""TF-IDF cosine similarity between response and reference (vectoriser fitted on the batch's texts)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family


def _tfidf(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    from sklearn.feature_extraction.text import TfidfVectorizer

    responses = [p.response for p in pairs]
    references = [p.reference for p in pairs]
    vectorizer = TfidfVectorizer().fit(list(dict.fromkeys(responses + references)))
    a = vectorizer.transform(responses)
    b = vectorizer.transform(references)
    # Rows are L2-normalised, so the row-wise dot product is the cosine (0 for an empty text).
    return {"tfidf_cosine": np.asarray(a.multiply(b).sum(axis=1)).ravel()}


register_family(
    "tfidf",
    [
        MetricSpec(
            "tfidf_cosine",
            "TF-IDF cosine similarity to the reference",
            "tfidf",
            True,
            "scikit-learn TfidfVectorizer, fitted on the benchmark's texts",
        )
    ],
    _tfidf,
)
