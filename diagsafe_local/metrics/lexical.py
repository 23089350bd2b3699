"""Token- and character-overlap metrics against the reference: BLEU, chrF and SQuAD token-F1."""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family

_WORD = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


@lru_cache(maxsize=65536)
def word_tokens(text: str) -> tuple[str, ...]:
    """Lower-cased words (keeping inner apostrophes) and single punctuation marks.

    A regex, not `nltk.word_tokenize`: that one spent a third of METEOR's time (scripts/bench_metrics.py).
    """
    return tuple(_WORD.findall(text.lower()))


def _bleu(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smoothing = {"bleu": None, "bleu_smoothed": SmoothingFunction().method1}
    out = {}
    with warnings.catch_warnings():
        # Unsmoothed BLEU warns on every pair without a 4-gram match; 0 is the intended value there.
        warnings.simplefilter("ignore")
        for name in names:
            out[name] = np.array(
                [
                    sentence_bleu(
                        [word_tokens(p.reference)], word_tokens(p.response), smoothing_function=smoothing[name]
                    )
                    if word_tokens(p.response) and word_tokens(p.reference)
                    else 0.0
                    for p in pairs
                ]
            )
    return out


def _chrf(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    return {"chrf": np.array([chrf.sentence_score(p.response, [p.reference]).score / 100.0 for p in pairs])}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def squad_normalize(text: str) -> list[str]:
    """SQuAD answer normalisation: lower-case, drop punctuation and articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split()


def squad_f1(prediction: str, truth: str) -> float:
    """SQuAD v1.1 token F1 between a prediction and a ground truth."""
    pred, gold = squad_normalize(prediction), squad_normalize(truth)
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _squad(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    return {"squad_f1": np.array([squad_f1(p.response, p.reference) for p in pairs])}


register_family(
    "bleu",
    [
        MetricSpec(
            "bleu",
            "NLTK sentence BLEU-4 vs the reference, unsmoothed (as in the paper)",
            "bleu",
            True,
            "Papineni et al. 2002; nltk.translate.bleu_score",
        ),
        MetricSpec(
            "bleu_smoothed",
            "NLTK sentence BLEU-4 vs the reference, smoothing method 1",
            "bleu",
            True,
            "Chen & Cherry 2014 smoothing; nltk.translate.bleu_score",
        ),
    ],
    _bleu,
)
register_family(
    "chrf",
    [MetricSpec("chrf", "chrF (sacrebleu) vs the reference, on [0, 1]", "chrf", True, "Popović 2015; sacrebleu")],
    _chrf,
)
register_family(
    "squad",
    [MetricSpec("squad_f1", "SQuAD token F1 vs the reference", "squad", True, "Rajpurkar et al. 2016, SQuAD v1.1")],
    _squad,
)
