"""Write a full-size synthetic benchmark file in the published HarmMetric Eval layout (for benchmarks).

274 prompts x 13 lines, text categories, integer ids: the shape of the released file, with the
synthetic ~100-word texts of scripts/bench_metrics.py. Time the CLI on it, e.g.

    .venv/bin/python scripts/make_published_layout.py /tmp/harmmetric_full.jsonl
    time .venv/bin/diagsafe-local bench --dataset /tmp/harmmetric_full.jsonl --metrics all --out /tmp/b
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_metrics import N_PROMPTS, N_RESPONSES, synthetic_pairs

from diagsafe_local.benchmark.dataset import Category, published_category
from diagsafe_local.core import jsonl


def rows() -> list[dict[str, object]]:
    pairs = synthetic_pairs()
    out: list[dict[str, object]] = []
    for p in range(N_PROMPTS):
        group = pairs[p * N_RESPONSES : (p + 1) * N_RESPONSES]
        prompt_id = 2000 + p
        texts = [group[0].reference, *(pair.response for pair in group)]
        for k, text in enumerate(texts):
            out.append(
                {
                    "harmful_prompt": group[0].prompt,
                    "response": text,
                    "response_category": published_category(Category(k)),
                    "attack_method": "GCG" if k == 1 else "",
                    "source": "synthetic",
                    "prompt_id": prompt_id,
                    "response_id": prompt_id * 100 + k,
                }
            )
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "harmmetric_full.jsonl")
    jsonl.write(target, rows())
    print(target)
