"""Benchmark (not a test): pipeline overhead over bare vLLM, speed-up over a naive loop, judge prefix-cache hits.

One engine (a tiny random-weight model built here; pass --model DIR for a real one) serves as target
and judge. The workload: N two-turn conversations (two target calls), then every answer judged under
the HarmJudge rubric's JSON schema. Three ways, each after resetting the prefix cache, best of --repeat:
  pipeline  diagsafe-local's Run (turn batching, records, fsync, summary);
  bare      the identical requests through LLM.chat, one call per turn and one for the judge;
  naive     one conversation at a time (timed on a subset, extrapolated).

Run: .venv/bin/python scripts/bench_pipeline.py [--n 256] [--model DIR] [--repeat 2]
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
    parser.add_argument("--n", type=int, default=256, help="conversations")
    parser.add_argument("--naive", type=int, default=24, help="conversations timed for the naive loop")
    parser.add_argument("--model", default=None, help="model directory (default: build a tiny one)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from diagsafe_local.core.messages import Message
    from diagsafe_local.engines.base import BorrowedEngine
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.evaluation.records import read_results
    from diagsafe_local.judging import JUDGES, JudgeInput
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

    work = Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    model = args.model or str(build_tiny_chat_model(work / "model"))
    engine_settings = {"model": model, "dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    engine = VLLMEngine(JudgeConfig(**engine_settings), structured_backend="xgrammar")
    llm = engine._llm
    items = [
        {
            "id": f"c{k}",
            "messages": [
                {"role": "user", "content": f"Conversation {k}: first question about step {k}."},
                {"role": "user", "content": f"Conversation {k}: and the next step?"},
            ],
        }
        for k in range(args.n)
    ]
    (work / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    target_tokens, judge_tokens = 48, 400
    rubric = JUDGES.get("harmjudge")

    def pipeline(out: Path) -> float:
        config = RunConfig.model_validate(
            {
                "dataset": {"path": str(work / "items.jsonl")},
                "target": {**engine_settings, "name": "t", "sampling": {"max_tokens": target_tokens}},
                "judge": {
                    **engine_settings,
                    "turns": "every",
                    "batch_size": 100_000,
                    "sampling": {"max_tokens": judge_tokens},
                },
                "output_dir": str(out),
            }
        )
        llm.reset_prefix_cache()
        start = time.perf_counter()
        Run(config, engine_factory=lambda *a, **k: BorrowedEngine(engine)).execute()
        return time.perf_counter() - start

    plain = SamplingParams(max_tokens=target_tokens, temperature=0.0)
    judged = SamplingParams(
        max_tokens=judge_tokens, temperature=0.0, structured_outputs=StructuredOutputsParams(json=rubric.schema)
    )

    def judge_messages(conversation: list[dict], answer: str) -> list[dict]:
        judged = JudgeInput(conversation=tuple(Message(**m) for m in conversation), answer=answer)
        return [m.model_dump() for m in rubric.render(judged)]

    def bare(subset: list[dict], one_by_one: bool = False) -> float:
        llm.reset_prefix_cache()

        def chat(batch: list[list[dict]], params: SamplingParams) -> list[str]:
            if one_by_one:
                return [llm.chat([c], params, use_tqdm=False)[0].outputs[0].text for c in batch]
            return [o.outputs[0].text for o in llm.chat(batch, params, use_tqdm=False)]

        start = time.perf_counter()
        first = [[i["messages"][0]] for i in subset]
        answers1 = chat(first, plain)
        second = [
            [i["messages"][0], {"role": "assistant", "content": a}, i["messages"][1]] for i, a in zip(subset, answers1)
        ]
        answers2 = chat(second, plain)
        judge_inputs = [judge_messages(c, a) for c, a in zip(first, answers1)]
        judge_inputs += [judge_messages(c, a) for c, a in zip(second, answers2)]
        chat(judge_inputs, judged)
        return time.perf_counter() - start

    times_pipeline, times_bare = [], []
    for k in range(args.repeat):
        times_pipeline.append(pipeline(work / f"run{k}"))
        times_bare.append(bare(items))
    t_pipe, t_bare = min(times_pipeline), min(times_bare)
    t_naive = bare(items[: args.naive], one_by_one=True) * args.n / args.naive

    results = read_results(work / "run0" / "results.jsonl")
    prompt = sum(r.judge_usage.prompt_tokens for r in results)
    cached = sum(r.judge_usage.cached_tokens for r in results)
    print(f"workload: {args.n} two-turn conversations, {len(results)} judgments, model {model}")
    print(f"bare LLM.chat (one call per turn + one judge call): {t_bare:7.2f} s")
    print(
        f"diagsafe-local pipeline                           : {t_pipe:7.2f} s  "
        f"(overhead {100 * (t_pipe / t_bare - 1):+.1f}%; target <= 5%)"
    )
    print(
        f"naive one-conversation-at-a-time loop (extrapolated from {args.naive}): {t_naive:7.2f} s  "
        f"(pipeline is {t_naive / t_pipe:.1f}x faster)"
    )
    print(f"judge prefix-cache hits: {cached}/{prompt} prompt tokens = {100 * cached / prompt:.1f}% (target >= 50%)")
    engine.close()


if __name__ == "__main__":
    main()
