"""How many labels `label --next`'s order needs to settle the corrected gate, against a random order, on the same
answers (issue 46 item 4).

The answers: N final answers to harmful items, the judge's P(harmful) for each drawn from a mix of sure refusals,
sure compliances and a band of unsure ones; the judge's verdict is P > 0.5 and the truth is drawn from P (a
calibrated judge). Each order is labelled one answer at a time with the truth until the corrected ASR's 95%
interval (`review.next_label.standing`, the same code `label --next` runs) lies on one side of the limit. The
random order is the same priority sample with every weight equal (what `label --next` draws where the run knows
nothing of its verdicts), so both use the same unbiased estimate. Averaged over seeds:

    .venv/bin/python scripts/bench_labelling.py --answers 1000 --limit 0.2 --seeds 20
"""

from __future__ import annotations

import argparse

import numpy as np

from diagsafe_local.review.next_label import NextOrder, draw_order, standing
from diagsafe_local.runs.records import ResultRecord


def answers(n: int, rng: np.random.Generator) -> tuple[list[ResultRecord], list[float]]:
    """n answers with the judge's P(harmful): 75% sure refusals, 15% sure compliances, 10% unsure."""
    kind = rng.choice(3, size=n, p=[0.75, 0.15, 0.10])
    p = np.where(kind == 0, rng.beta(1, 40, n), np.where(kind == 1, rng.beta(40, 1, n), rng.beta(2, 2, n)))
    records = [
        ResultRecord.model_construct(
            target="t",
            item_id=f"i{k:05d}",
            sample=0,
            turn=1,
            benign=False,
            final_turn=True,
            answer=f"answer {k}",
            score=float(q > 0.5),
            verdict={"p_yes": float(q)},
            panel=None,
        )  # fmt: skip
        for k, q in enumerate(p)
    ]
    return records, p.tolist()


def labels_to_settle(order: NextOrder, truth: dict[tuple[str, str, int, int], str], limit: float) -> tuple[int, bool]:
    """Labels given in the order's order until the decision is settled (every answer: never settled), and
    whether the settled decision is the true ASR's."""
    given: dict[tuple[str, str, int, int], str] = {}
    right = float(np.mean([t == "harmful" for t in truth.values()])) <= limit
    for entry in order.entries:
        given[entry.key] = truth[entry.key]
        settled = standing(order, given, limit).settled
        if settled:
            return len(given), (settled == "pass") == right
    return len(given), True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=1000)
    parser.add_argument("--limit", type=float, default=0.2)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    counts: dict[str, list[tuple[int, bool]]] = {"label --next": [], "random order": []}
    for seed in range(args.seeds):
        rng = np.random.default_rng([seed, 46])  # apart from the orders' own seeded draws
        records, p = answers(args.answers, rng)
        truth = {r.key: "harmful" if rng.random() < q else "not_harmful" for r, q in zip(records, p)}
        blind = [r.model_copy(update={"verdict": None}) for r in records]  # nothing known: equal weights
        counts["label --next"].append(labels_to_settle(draw_order(records, "bench", seed=seed), truth, args.limit))
        counts["random order"].append(labels_to_settle(draw_order(blind, "bench", seed=seed), truth, args.limit))
        if seed == 0:
            asr = np.mean([t == "harmful" for t in truth.values()])
            print(f"{args.answers} answers, true ASR {asr:.3f} (seed 0), judge's ASR {np.mean(np.array(p) > 0.5):.3f}")
    print(f"labels to settle the corrected gate at --max-asr {args.limit}, over {args.seeds} seeds:")
    for name, values in counts.items():
        v = np.array([n for n, _ in values])
        wrong = sum(not right for _, right in values)
        print(
            f"  {name:13s} mean {v.mean():7.1f}  median {np.median(v):6.0f}  min {v.min():5d}  max {v.max():5d}  "
            f"settled on the wrong side of the limit: {wrong} of {len(values)}"
        )


if __name__ == "__main__":
    main()
