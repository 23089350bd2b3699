"""Benchmark (not a test): time every metric on a synthetic HarmMetric-sized dataset.

274 prompts x 13 responses, ~100-word answers.

1. Whole processes, side by side (what a user waits for): `diagsafe-local bench` with all 24 ROUGE variants
   against a plain script that loops `rouge_score.RougeScorer` over the same file for ROUGE-1 recall alone,
   on the full-size published layout (scripts/make_published_layout.py); alternated, after one warm-up each,
   median of --runs (5); prints the ratio (target <= 0.4).
2. In process: our 24-variant ROUGE pass against the same loop (values checked identical), then every other
   metric over the 3,288 (response, reference) pairs.

Run: .venv/bin/python scripts/bench_metrics.py [--runs N] [--full] [--whole-only]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from make_published_layout import WORDS, rows, synthetic_pairs

from diagsafe_local.metrics import METRICS, compute_metrics
from diagsafe_local.metrics.rouge import MEASURES, ROUGE_TYPES, metric_name

FULL = "--full" in sys.argv
RUNS = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 5
ROUGE_SCORE_LOOP = """
import json, sys
from rouge_score.rouge_scorer import RougeScorer
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
refs = {r["prompt_id"]: r["response"] for r in rows if r["response_category"] == "reference response"}
scorer = RougeScorer(["rouge1"], use_stemmer=True)
recall = [scorer.score(refs[r["prompt_id"]], r["response"])["rouge1"].recall
          for r in rows if r["response_category"] != "reference response"]
print(len(recall))
"""
EMBED_SUBSET = 300  # MiniLM on 2 CPU cores needs ~60 ms a 256-token text


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def whole_processes() -> None:
    """Time `diagsafe-local bench` (24 ROUGE variants) and the rouge_score loop as whole processes, alternated."""
    from diagsafe_local.core import jsonl

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "harmmetric_full.jsonl"
        jsonl.write(data, rows())
        names = [metric_name(t, m, stem) for stem in (True, False) for t in ROUGE_TYPES for m in MEASURES]
        cli = Path(sys.executable).with_name("diagsafe-local")
        ours = [str(cli), "bench", "--dataset", str(data), "--metrics", ",".join(names), "--out", f"{tmp}/out"]
        loop = [sys.executable, "-c", ROUGE_SCORE_LOOP, str(data)]
        times: dict[str, list[float]] = {"ours": [], "loop": []}
        for k in range(RUNS + 1):  # the first round warms the page cache and is not counted
            for name, command in (("ours", ours), ("loop", loop)):
                start = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                if k:
                    times[name].append(time.perf_counter() - start)
    ours_s, loop_s = statistics.median(times["ours"]), statistics.median(times["loop"])
    ratios = [a / b for a, b in zip(times["ours"], times["loop"])]
    print(f"whole processes, full-size published layout (3,562 rows), median of {RUNS}, alternated:")
    print(f"  diagsafe-local bench, all 24 ROUGE variants : {ours_s:6.2f} s")
    print(f"  rouge_score loop, ROUGE-1 recall alone       : {loop_s:6.2f} s")
    print(f"  ratio {ours_s / loop_s:.2f} (per round {min(ratios):.2f}-{max(ratios):.2f}; target <= 0.40)\n")


def main() -> None:
    whole_processes()
    if "--whole-only" in sys.argv:
        return
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
