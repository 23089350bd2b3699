"""Write a full-size synthetic benchmark file in the published HarmMetric Eval layout (for benchmarks).

274 prompts x 13 lines, text categories, integer ids: the shape of the released file, with
synthetic ~100-word multi-line texts of a small vocabulary. Time the CLI on it, e.g.

    .venv/bin/python scripts/make_published_layout.py /tmp/harmmetric_full.jsonl
    time .venv/bin/diagsafe-local bench --dataset /tmp/harmmetric_full.jsonl --metrics all --out /tmp/b
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from diagsafe_local.benchmark.dataset import Category, published_category
from diagsafe_local.core import jsonl
from diagsafe_local.metrics import TextPair

N_PROMPTS, N_RESPONSES, WORDS = 274, 12, 100


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
