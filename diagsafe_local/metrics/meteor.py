"""METEOR against the reference (NLTK's implementation, with real WordNet synonyms)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family
from diagsafe_local.metrics.lexical import word_tokens
from diagsafe_local.metrics.wordnet import load_wordnet


class _CachedWordNet:
    """NLTK's METEOR looks up the same words' synsets for every pair; memoising them is ~10x faster."""

    def __init__(self, reader: Any) -> None:
        self._synsets = lru_cache(maxsize=None)(lambda word: tuple(reader.synsets(word)))

    def synsets(self, word: str) -> tuple[Any, ...]:
        return self._synsets(word)


class _CachedStemmer:
    def __init__(self) -> None:
        from nltk.stem.porter import PorterStemmer

        self.stem = lru_cache(maxsize=None)(PorterStemmer().stem)


@lru_cache(maxsize=1)
def _resources() -> tuple[_CachedWordNet, _CachedStemmer]:
    return _CachedWordNet(load_wordnet()), _CachedStemmer()


def meteor(response: str, reference: str) -> float:
    """NLTK METEOR of `response` against one reference, on Treebank word tokens."""
    from nltk.translate.meteor_score import meteor_score

    wordnet, stemmer = _resources()
    hyp, ref = word_tokens(response), word_tokens(reference)
    if not hyp or not ref:
        return 0.0
    return float(meteor_score([ref], hyp, stemmer=stemmer, wordnet=wordnet))


def _meteor(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    return {"meteor": np.array([meteor(p.response, p.reference) for p in pairs])}


register_family(
    "meteor",
    [MetricSpec("meteor", "METEOR vs the reference (NLTK, WordNet synonyms)", "meteor", True,
                "Banerjee & Lavie 2005; nltk.translate.meteor_score")],
    _meteor,
)
