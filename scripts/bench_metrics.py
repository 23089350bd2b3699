"""Benchmark (not a test): time every metric on a synthetic HarmMetric-sized dataset.

274 prompts x 13 responses, ~100-word answers. Compares our 24-variant ROUGE pass with a plain
per-pair loop over rouge_score.RougeScorer for ROUGE-1 alone, checks the values are identical,
and times METEOR over the 3,288 (response, reference) pairs. Prints the figures.

Run: .venv/bin/python scripts/bench_metrics.py [--full]
"""

from __future__ import annotations

import random
import sys
import time

import numpy as np

from diagsafe_local.metrics import METRICS, TextPair, compute_metrics
from diagsafe_local.metrics.rouge import MEASURES, ROUGE_TYPES, metric_name

N_PROMPTS, N_RESPONSES, WORDS = 274, 12, 100
FULL = "--full" in sys.argv
EMBED_SUBSET = 300  # MiniLM on 2 CPU cores needs ~60 ms a 256-token text


def synthetic_pairs(seed: int = 0) -> list[TextPair]:
    rng = random.Random(seed)
    vocab = [
        "mix",
        "mixing",
        "heat",
        "heated",
        "slowly",
        "powder",
        "liquid",
        "container",
        "step",
        "steps",
        "first",
        "then",
        "carefully",
        "measure",
        "measured",
        "temperature",
        "minutes",
        "add",
        "adding",
        "stir",
        "stirring",
        "the",
        "a",
        "of",
        "to",
        "and",
        "with",
        "for",
        "in",
        "on",
        "is",
        "are",
        "you",
        "should",
        "will",
        "can",
        "process",
        "result",
        "results",
        "method",
        "methods",
        "material",
        "materials",
        "quickly",
        "cool",
        "cooled",
        "sorry",
        "cannot",
        "help",
        "request",
        "safety",
        "dangerous",
        "illegal",
        "instead",
        "consider",
        "resources",
    ] + [f"term{k}" for k in range(400)]

    def text() -> str:
        lines = []
        for _ in range(rng.randint(1, 5)):
            lines.append(" ".join(rng.choice(vocab) for _ in range(WORDS // 3)) + ".")
        return "\n".join(lines)

    pairs = []
    for p in range(N_PROMPTS):
        reference = text()
        prompt = f"How do I do task {p}?"
        for _ in range(N_RESPONSES):
            pairs.append(TextPair(prompt, text(), reference))
    return pairs


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    pairs = synthetic_pairs()
    print(f"{len(pairs)} (response, reference) pairs, ~{WORDS} words each\n")

    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(["rouge1"], use_stemmer=True)
    baseline, t_loop = timed(lambda: np.array([scorer.score(p.reference, p.response)["rouge1"].recall for p in pairs]))
    names = [metric_name(t, m, stem) for stem in (True, False) for t in ROUGE_TYPES for m in MEASURES]
    ours, t_all = timed(lambda: compute_metrics(names, pairs))
    assert np.array_equal(ours["rouge1_recall"], baseline), "ROUGE-1 recall differs from rouge_score"
    print(f"rouge_score per-pair loop, ROUGE-1 only : {t_loop:6.2f} s")
    print(
        f"diagsafe-local, all 24 ROUGE variants   : {t_all:6.2f} s  "
        f"({t_all / t_loop:.0%} of the loop; target <= 50%; ROUGE-1 recall identical)"
    )

    from diagsafe_local.metrics.embedding import _model
    from diagsafe_local.metrics.meteor import _resources

    _, t_load = timed(_resources)
    _, t_model = timed(_model)
    print(f"\nonce per process: WordNet load for METEOR {t_load:.2f} s, MiniLM load {t_model:.2f} s")
    print("per metric (the first metric of a family pays its library import):")
    for spec in METRICS:
        if spec.family == "rouge":
            continue
        subset = pairs[:EMBED_SUBSET] if spec.name == "embedding_cosine" and not FULL else pairs
        _, seconds = timed(lambda name=spec.name, chosen=subset: compute_metrics([name], chosen))
        note = "  (target < 5 s)" if spec.name == "meteor" else ""
        if len(subset) < len(pairs):
            seconds *= len(pairs) / len(subset)
            note = f"  (extrapolated from {len(subset)} pairs; --full to run all)"
        print(f"  {spec.name:18s} {seconds:7.2f} s{note}")


if __name__ == "__main__":
    main()
