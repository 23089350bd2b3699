"""ROUGE-1/2/L/Lsum x precision/recall/F, with and without Porter stemming: 24 metrics in one pass.

Values equal the `rouge-score` package's (`RougeScorer(..., use_stemmer=...)`, response as prediction,
reference as target), tested to 1e-12. We compute them ourselves because the per-pair `RougeScorer`
loop is too slow for the benchmark (measured in scripts/bench_metrics.py): it re-tokenises and
re-stems the shared reference for every response, stems every token again, and fills a pure-Python
LCS table. Here each distinct text is tokenised once, each distinct word stemmed once, LCS lengths come
from rapidfuzz's LCSseq (C++), and ROUGE-Lsum's union LCS is backtracked exactly as `rouge-score` does.

Why not rapidfuzz's alignment for the union LCS too: where several LCS exist, its editops pick another one
than `rouge-score`'s backtracking (in 42% of random token sequences of a small vocabulary; every orientation of
the call was tried), and the union of different LCS changes ROUGE-Lsum. So the union is backtracked here, on the
bit-parallel LCS rows (Allison & Dix 1986; Hyyrö 2004) of Python integers, and only where it can matter: a
reference sentence is shortened to the tokens the candidate sentence has (a token the candidate lacks is
passed over by the backtracking anyway), a pair with no common token is skipped, a pair whose LCS is the whole
shortened sentence needs no choice, and a reference sentence whose every index is in the union stops early.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import cache, lru_cache

import numpy as np
from rapidfuzz.distance import LCSseq

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
MEASURES = ("precision", "recall", "f")
_WORD = re.compile(r"[a-z0-9]+")


@cache
def _stem(word: str) -> str:
    return _porter().stem(word) if len(word) > 3 else word


@lru_cache(maxsize=1)
def _porter():
    """NLTK's Porter stemmer (the one `rouge-score` uses), loaded without running `nltk/__init__`.

    `import nltk` imports most of NLTK, SciPy's statistics included: 2.3 s of a 5.5 s `bench` run over the
    24 ROUGE variants (cProfile, the full-size published layout). The stemmer's module needs three small
    modules of the package; it is loaded under stand-in parent packages that are removed right after, so
    a later `import nltk` (METEOR) imports the whole package as usual. Where NLTK is already imported, or
    its layout differs, the plain import is used.
    """
    import importlib
    import importlib.util
    import sys
    import types

    if "nltk" not in sys.modules:
        spec = importlib.util.find_spec("nltk")
        locations = list(spec.submodule_search_locations or []) if spec else []
        if locations:
            for name, path in (("nltk", locations[0]), ("nltk.stem", f"{locations[0]}/stem")):
                stand_in = types.ModuleType(name)
                stand_in.__path__ = [path]
                sys.modules[name] = stand_in
            try:
                return importlib.import_module("nltk.stem.porter").PorterStemmer()
            except ImportError:
                pass
            finally:
                for name in [n for n in sys.modules if n == "nltk" or n.startswith("nltk.")]:
                    del sys.modules[name]
    from nltk.stem import porter

    return porter.PorterStemmer()


@lru_cache(maxsize=100_000)
def tokenize(text: str, stem: bool) -> tuple[str, ...]:
    """`rouge-score`'s default tokenisation: lower-case alphanumeric runs, words over 3 chars Porter-stemmed.

    (`rouge-score` replaces every other character by a space, splits, and keeps tokens matching
    `^[a-z0-9]+$`: the same runs `findall` returns; a Porter stem of such a run is one again.)
    """
    return tuple(token for line in _sentences(text, stem) for token in line)


@lru_cache(maxsize=100_000)
def _sentences(text: str, stem: bool) -> tuple[tuple[str, ...], ...]:
    """Tokens of each non-empty line (ROUGE-Lsum's sentences); a line break is a separator either way, so the
    text's tokens are these lines' tokens in order."""
    return tuple(_tokenize_line(line, stem) for line in text.split("\n") if line)


def _tokenize_line(line: str, stem: bool) -> tuple[str, ...]:
    words = _WORD.findall(line.lower())
    return tuple(map(_stem, words)) if stem else tuple(words)


def _lcs_rows(ref: Sequence[str], can: Sequence[str]) -> list[int]:
    """Bit-parallel LCS rows: V[i] encodes row i of the LCS table of ref[:i] vs can.

    table[i][j] == j - popcount(V[i] & ((1 << j) - 1)).
    """
    masks = _masks(tuple(can))
    full = (1 << len(can)) - 1
    v = full
    rows = [v]
    for token in ref:
        u = v & masks.get(token, 0)
        v = ((v + u) | (v - u)) & full
        rows.append(v)
    return rows


@lru_cache(maxsize=4096)
def _masks(can: tuple[str, ...]) -> dict[str, int]:
    """Each token's positions in `can` as a bit mask (a candidate sentence meets every reference sentence)."""
    masks: dict[str, int] = {}
    for j, token in enumerate(can):
        masks[token] = masks.get(token, 0) | (1 << j)
    return masks


def lcs_length(ref: Sequence[str], can: Sequence[str]) -> int:
    """Length of the longest common subsequence (rapidfuzz, in C++)."""
    if not ref or not can:
        return 0
    return int(LCSseq.similarity(ref, can))


def lcs_indices(ref: Sequence[str], can: Sequence[str]) -> list[int]:
    """Indices into `ref` of one LCS, chosen exactly as `rouge-score`'s back-tracking does."""
    if not ref or not can:
        return []
    rows = _lcs_rows(ref, can)
    i, j = len(ref), len(can)
    remaining = j - (rows[i] & ((1 << j) - 1)).bit_count()  # table[i][j]: the LCS length
    picked: list[int] = []
    while remaining:
        if ref[i - 1] == can[j - 1]:
            picked.append(i - 1)
            i -= 1
            j -= 1
            remaining -= 1
        # Otherwise `rouge-score` steps left if table[i][j-1] > table[i-1][j], else up. One of them equals
        # table[i][j] (== remaining), so it steps up exactly when table[i-1][j] == remaining.
        elif j - (rows[i - 1] & ((1 << j) - 1)).bit_count() == remaining:
            i -= 1
        else:
            j -= 1
    return picked[::-1]


def _prf(hits: int, n_pred: int, n_target: int) -> tuple[float, float, float]:
    precision = hits / n_pred if n_pred else 0.0
    recall = hits / n_target if n_target else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f


@lru_cache(maxsize=100_000)
def _ngrams(text: str, stem: bool, n: int) -> Counter[tuple[str, ...]]:
    """n-gram counts of a text, once per text (a reference is shared by all its responses)."""
    tokens = tokenize(text, stem)
    return Counter(zip(*(tokens[k:] for k in range(n))))


def _ngram_prf(target: str, pred: str, stem: bool, n: int) -> tuple[float, float, float]:
    t, p = _ngrams(target, stem, n), _ngrams(pred, stem, n)
    hits = sum(min(count, t[gram]) for gram, count in p.items() if gram in t)
    # rouge-score divides by max(count, 1): an empty side gives 0, never a division error.
    return _prf(hits, max(p.total(), 1), max(t.total(), 1))


def _lsum_prf(target_text: str, pred_text: str, stem: bool) -> tuple[float, float, float]:
    ref_sents, can_sents = _sentences(target_text, stem), _sentences(pred_text, stem)
    m, n = sum(map(len, ref_sents)), sum(map(len, can_sents))
    if not ref_sents or not can_sents or not m or not n:
        return 0.0, 0.0, 0.0
    if len(ref_sents) == 1 and len(can_sents) == 1:
        return _prf(lcs_length(ref_sents[0], can_sents[0]), n, m)
    counts_r, counts_c = Counter(tokenize(target_text, stem)), Counter(tokenize(pred_text, stem))
    can_sets = [frozenset(c) for c in can_sents]
    hits = 0
    for r in ref_sents:
        union = sorted(_union_lcs(r, can_sents, can_sets))
        for token in (r[i] for i in union):
            if counts_c[token] > 0 and counts_r[token] > 0:
                hits += 1
                counts_c[token] -= 1
                counts_r[token] -= 1
    return _prf(hits, n, m)


def _union_lcs(ref: tuple[str, ...], cans: Sequence[tuple[str, ...]], can_sets: Sequence[frozenset[str]]) -> set[int]:
    """The union over candidate sentences of the indices into `ref` of `rouge-score`'s LCS with each (see the
    module docstring for why each is backtracked here, and what is skipped)."""
    union: set[int] = set()
    for can, tokens in zip(cans, can_sets):
        kept = [i for i, token in enumerate(ref) if token in tokens]
        if not kept:
            continue
        shortened = [ref[i] for i in kept]
        if lcs_length(shortened, can) == len(kept):  # the one LCS is all of it: nothing to choose
            union.update(kept)
        else:
            union.update(kept[k] for k in lcs_indices(shortened, can))
        if len(union) == len(ref):
            break
    return union


def rouge_all(
    target: str, prediction: str, stem: bool, types: Sequence[str] = ROUGE_TYPES
) -> dict[str, tuple[float, float, float]]:
    """(precision, recall, F) of each requested ROUGE type for one pair."""
    t, p = tokenize(target, stem), tokenize(prediction, stem)
    compute = {
        "rouge1": lambda: _ngram_prf(target, prediction, stem, 1),
        "rouge2": lambda: _ngram_prf(target, prediction, stem, 2),
        "rougeL": lambda: _prf(lcs_length(t, p), len(p), len(t)) if t and p else (0.0, 0.0, 0.0),
        "rougeLsum": lambda: _lsum_prf(target, prediction, stem),
    }
    return {rouge_type: compute[rouge_type]() for rouge_type in types}


def metric_name(rouge_type: str, measure: str, stem: bool) -> str:
    return f"{rouge_type}_{measure}" + ("" if stem else "_nostem")


def _compute(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    wanted = set(names)
    out = {name: np.empty(len(pairs)) for name in names}
    for stem in (True, False):
        variants = [
            (name, rouge_type, MEASURES.index(measure))
            for rouge_type in ROUGE_TYPES
            for measure in MEASURES
            if (name := metric_name(rouge_type, measure, stem)) in wanted
        ]
        if not variants:
            continue
        types = sorted({rouge_type for _, rouge_type, _ in variants}, key=ROUGE_TYPES.index)
        for row, pair in enumerate(pairs):
            scores = rouge_all(pair.reference, pair.response, stem, types)
            for name, rouge_type, k in variants:
                out[name][row] = scores[rouge_type][k]
    return out


_LABEL = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
register_family(
    "rouge",
    [
        MetricSpec(
            metric_name(rouge_type, measure, stem),
            f"{_LABEL[rouge_type]} {measure} vs the reference, {'Porter-stemmed' if stem else 'unstemmed'}",
            "rouge",
            True,
            "Lin 2004; tokenisation and stemming of the rouge-score package",
        )
        for stem in (True, False)
        for rouge_type in ROUGE_TYPES
        for measure in MEASURES
    ],
    _compute,
)
