"""METEOR against the reference (NLTK's implementation, with real WordNet synonyms)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family
from diagsafe_local.metrics.lexical import word_tokens
from diagsafe_local.metrics.wordnet import load_wordnet


class _Lemma:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class _SynonymSet:
    """Stands in for a word's synsets: one object whose lemmas are all the word's distinct synonyms."""

    __slots__ = ("_lemmas",)

    def __init__(self, names: set[str]) -> None:
        self._lemmas = tuple(_Lemma(n) for n in sorted(names))

    def lemmas(self) -> tuple[_Lemma, ...]:
        return self._lemmas


class _CachedWordNet:
    """NLTK's METEOR asks for the same words' synonyms in every pair; we look each word up once.

    It gives NLTK the same synonym names (all lemmas of all synsets), merged into one stand-in synset.
    """

    def __init__(self, reader: Any) -> None:
        def lookup(word: str) -> tuple[_SynonymSet, ...]:
            names = {lemma.name() for synset in reader.synsets(word) for lemma in synset.lemmas()}
            return (_SynonymSet(names),) if names else ()

        self.synsets = lru_cache(maxsize=None)(lookup)


class _CachedStemmer:
    def __init__(self) -> None:
        from nltk.stem.porter import PorterStemmer

        self.stem = lru_cache(maxsize=None)(PorterStemmer().stem)


@lru_cache(maxsize=1)
def _resources() -> tuple[_CachedWordNet, _CachedStemmer]:
    return _CachedWordNet(load_wordnet()), _CachedStemmer()


def meteor(response: str, reference: str) -> float:
    """NLTK METEOR of `response` against one reference, on `word_tokens`."""
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
    [
        MetricSpec(
            "meteor",
            "METEOR vs the reference (NLTK, WordNet synonyms)",
            "meteor",
            True,
            "Banerjee & Lavie 2005; nltk.translate.meteor_score",
        )
    ],
    _meteor,
)
