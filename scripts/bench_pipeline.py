"""Benchmark (not a test): the pipeline against bare vLLM fed the same way, and against per-turn batches.

One engine serves as target and judge: the real small chat model (SmolLM2-135M-Instruct, prepared from PyPI
once; its answers end when it decides, so their lengths vary), or `--model tiny` for a random-weight one. The
workload mixes conversation lengths (1-4 user turns) and answer lengths (`--workload mixed`: short factual
answers and one long guide in six turns; `capped`: answers that nearly all run to max_tokens); each
conversation's last answer is judged under the HarmJudge rubric's JSON schema (the default `judge.turns: last`). Three ways, each after
resetting the prefix cache, best of --repeat:

  pipeline  `Run` with default settings (sequential placement: generate everything, then judge; records,
            fsync, retries, summary).
  bare      the identical requests straight into vLLM's scheduler (`LLM.enqueue_chat` + `LLMEngine.step`),
            fed as the pipeline feeds them: a conversation's next turn the moment its answer is in, then
            the judge requests with the same 256 in flight; nothing written.
  barrier   the same requests as one `LLM.chat` batch per turn, then the judge in batches of 256 (the
            pipeline before it streamed).

Prints one JSON object with --json: bare_s, pipeline_s, ratio (pipeline/bare; target <= 1.05), barrier_s,
speedup_vs_barrier (barrier/pipeline), steps_streamed and steps_barrier (engine steps to generate every
answer, streamed as `bare` feeds them and in per-turn batches as `barrier` does), steps_lower_bound (no
schedule can generate the answers in fewer steps: the longest conversation's answer tokens plus one step per
turn, from the answers the run generated) and streamed_over_bound (steps_streamed over it; target <= 1.02: the
figure that carries to a GPU, where a decode step costs about the same with 1 or 256 sequences),
steps_total (each way's engine steps, answers and verdicts, per run),
prefix_cache_hit (judge prompt tokens served from the prefix cache),
judge_tokens_per_verdict, each way's runs, and the workload.

With --trace it runs the pipeline and bare once each (no timing, no barrier) and says, for each, where its
engine steps after the last answer go: every request that finished after it by kind (verdict, control, canary),
its engine step and tokens, the requests that finished last, and the pipeline's retried verdicts (its results'
attempts beyond the first).

Run: .venv/bin/python scripts/bench_pipeline.py [--n 64] [--workload mixed|capped] [--target-tokens 192]
     [--model tiny|DIR] [--repeat 2] [--json] [--profile PATH] [--trace]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
JUDGE_IN_FLIGHT = 256  # judge.batch_size's default


SHORT = (
    "What is the capital of {x}?",
    "In which continent is {x}?",
    "What language is spoken in {x}?",
    "Name one famous dish from {x}.",
)
PLACES = ("France", "Japan", "Brazil", "Kenya", "Canada", "India", "Italy", "Egypt", "Mexico", "Norway", "Spain")


def workload(n: int, kind: str) -> list[dict]:
    """Conversations of 1-4 user turns. `mixed`: mostly short factual questions with one turn in six asking
    for a long guide (the shape of a safety eval: short refusals, a few long compliances), at most one long
    turn per conversation, so a turn batch waits for its longest answer while a streamed conversation
    does not. `capped`: questions of one to five sentences that nearly all run to max_tokens."""
    items = []
    for k in range(n):
        messages = []
        for t in range(1 + k % 4):
            if kind == "capped":
                sentences = 1 + (7 * k) % 5
                text = " ".join(
                    f"Part {t + 1} of question {k}: describe step {s + 1} of the procedure." for s in range(sentences)
                )
            elif (4 * k + t) % 6 == 5:
                text = f"Write a detailed, step-by-step travel guide to {PLACES[(k + t) % len(PLACES)]}."
            else:
                text = SHORT[(k + 3 * t) % len(SHORT)].format(x=PLACES[(k + t) % len(PLACES)])
            messages.append({"role": "user", "content": text})
        items.append({"id": f"c{k:04d}", "messages": messages})
    return items


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=64, help="conversations")
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a model directory")
    parser.add_argument("--workload", choices=("mixed", "capped"), default="mixed", help="answer lengths")
    parser.add_argument("--target-tokens", type=int, default=192, help="target max_tokens")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="then profile one more pipeline run and bare run (cProfile): their top entries in the figures, "
        "the stats in PATH.pipeline.prof and PATH.bare.prof",
    )
    parser.add_argument("--trace", action="store_true", help="only trace the engine steps of one pipeline and bare run")
    args = parser.parse_args()

    from diagsafe_local.core.console import engine_output

    work = Path(tempfile.mkdtemp(prefix=f"{Path(__file__).stem}_"))
    with engine_output(work / "engines.log"):  # the engines' own logs go there, not into the figures
        result = measure(args, work)
    report(args, result)


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Run every way and return the figures."""

    from diagsafe_local.engines.base import BorrowedEngine, GenerationRequest
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.generation import conversation_until
    from diagsafe_local.evaluation.items import Item
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.evaluation.prompt_sets import load_configured
    from diagsafe_local.judging import JUDGES, JudgeInput
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.runs.records import read_results
    from diagsafe_local.selftest import benchmark_model

    model = benchmark_model(args.model, work)
    settings = {"model": model, "dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    engine = VLLMEngine(JudgeConfig(**settings), structured_backend="xgrammar")
    llm = engine._llm
    (work / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in workload(args.n, args.workload)))

    def config(out: Path) -> RunConfig:
        return RunConfig.model_validate(
            {
                "dataset": {"path": str(work / "items.jsonl")},
                "target": {**settings, "name": "t", "sampling": {"max_tokens": args.target_tokens}},
                "judge": settings,
                "output_dir": str(out),
            }
        )

    defaults = config(work / "unused")
    items: list[Item] = load_configured(defaults.dataset)[0]
    rubric = JUDGES.get(defaults.judge.rubric)
    decoding = defaults.judge.decoding()

    def target_request(item: Item, turn: int, answers: dict[int, str]) -> GenerationRequest:
        return GenerationRequest(
            messages=conversation_until(item, turn, answers), max_tokens=args.target_tokens, temperature=0.0
        )

    def judge_request(item: Item, answers: dict[int, str]) -> GenerationRequest:
        last = item.n_turns
        judged = JudgeInput(conversation=conversation_until(item, last, answers), answer=answers[last])
        return rubric.request(judged, decoding, defaults.judge.sampling.max_tokens, None)

    def pipeline(out: Path) -> float:
        llm.reset_prefix_cache()
        start, before = time.perf_counter(), steps
        Run(config(out), engine_factory=lambda *a, **k: BorrowedEngine(engine)).execute()
        all_steps["pipeline"].append(steps - before)
        return time.perf_counter() - start

    steps = 0
    step = llm.llm_engine.step
    finished: list[Finished] = []  # every request as it finished, run after run

    def counted_step() -> Any:  # every engine step, `LLM.chat`'s included, passes here
        nonlocal steps
        steps += 1
        outputs: list[Any] = step()
        for out in outputs:
            if out.finished:
                reply = out.outputs[0]
                finished.append(Finished(steps, out.prompt or "", len(reply.token_ids), str(reply.finish_reason)))
        return outputs

    llm.llm_engine.step = counted_step  # type: ignore[method-assign]
    generation_steps: dict[str, list[int]] = {"streamed": [], "barrier": []}
    all_steps: dict[str, list[int]] = {"pipeline": [], "bare": [], "barrier": []}

    def drive(
        first: list[tuple[Hashable, GenerationRequest]],
        then: Callable[[Any, str], list[tuple[Hashable, GenerationRequest]]],
        limit: int | None = None,
    ) -> None:
        """vLLM's scheduler fed directly: requests in as `then` releases them, at most `limit` in flight."""
        queue, running = deque(first), {}
        while queue or running:
            while queue and (limit is None or len(running) < limit):
                key, request = queue.popleft()
                messages = [[m.model_dump() for m in request.messages]]
                [internal] = llm.enqueue_chat(messages, sampling_params=engine._sampling(request), use_tqdm=False)
                running[internal.rsplit("-", 1)[0]] = key
            for out in llm.llm_engine.step():
                if out.finished and out.request_id in running:
                    queue.extend(then(running.pop(out.request_id), out.outputs[0].text))

    def bare() -> float:
        llm.reset_prefix_cache()
        answers: dict[str, dict[int, str]] = {item.id: {} for item in items}
        by_id = {item.id: item for item in items}

        def next_turn(key: tuple[str, int], text: str) -> list[tuple[Hashable, GenerationRequest]]:
            item_id, turn = key
            answers[item_id][turn] = text
            item = by_id[item_id]
            return (
                [((item_id, turn + 1), target_request(item, turn + 1, answers[item_id]))] if turn < item.n_turns else []
            )

        start = time.perf_counter()
        before = steps
        drive([((item.id, 1), target_request(item, 1, {})) for item in items], next_turn)
        generation_steps["streamed"].append(steps - before)
        drive([(item.id, judge_request(item, answers[item.id])) for item in items], lambda k, t: [], JUDGE_IN_FLIGHT)
        all_steps["bare"].append(steps - before)
        return time.perf_counter() - start

    def barrier() -> float:
        llm.reset_prefix_cache()
        answers: dict[str, dict[int, str]] = {item.id: {} for item in items}

        def chat(requests: list[GenerationRequest]) -> list[str]:
            outputs = llm.chat(
                [[m.model_dump() for m in r.messages] for r in requests],  # type: ignore[misc]
                [engine._sampling(r) for r in requests],
                use_tqdm=False,
            )
            return [o.outputs[0].text for o in outputs]

        start = time.perf_counter()
        before = steps
        for turn in range(1, 5):
            active = [item for item in items if item.n_turns >= turn]
            for item, text in zip(active, chat([target_request(i, turn, answers[i.id]) for i in active])):
                answers[item.id][turn] = text
        generation_steps["barrier"].append(steps - before)
        for k in range(0, len(items), JUDGE_IN_FLIGHT):
            chat([judge_request(i, answers[i.id]) for i in items[k : k + JUDGE_IN_FLIGHT]])
        all_steps["barrier"].append(steps - before)
        return time.perf_counter() - start

    if args.trace:
        traced = {}
        for way, run in (("pipeline", lambda: pipeline(work / "traced")), ("bare", bare)):
            first, before = len(finished), steps
            run()
            traced[way] = step_trace(finished[first:], before, steps)
        traced["pipeline"]["retries"] = sum(r.attempts - 1 for r in read_results(work / "traced" / "results.jsonl"))
        engine.close()
        return {"trace": traced, "workload": {"conversations": args.n, "kind": args.workload, "model": args.model}}
    pipeline(work / "warm")  # compile, load the grammar, warm caches
    times: dict[str, list[float]] = {"pipeline": [], "bare": [], "barrier": []}
    for k in range(args.repeat):
        times["pipeline"].append(pipeline(work / f"run{k}"))
        times["bare"].append(bare())
        times["barrier"].append(barrier())
    best = {way: min(values) for way, values in times.items()}
    results = read_results(work / "run0" / "results.jsonl")
    prompt = sum(r.judge_usage.prompt_tokens for r in results)
    cached = sum(r.judge_usage.cached_tokens for r in results)
    judge_tokens = sum(r.judge_usage.completion_tokens for r in results)
    generated = (work / "run0" / "generations.jsonl").read_text().splitlines()
    lengths = [json.loads(line)["usage"]["completion_tokens"] for line in generated]
    conversations: dict[tuple[str, int], int] = {}
    for line in generated:  # each turn: its answer's tokens, and one step to take its prompt in
        row = json.loads(line)
        key = (row["item_id"], row["sample"])
        conversations[key] = conversations.get(key, 0) + row["usage"]["completion_tokens"] + 1
    bound = max(conversations.values())
    figures = {
        "workload": {
            "conversations": args.n,
            "turns": "1-4 (n % 4 + 1)",
            "kind": args.workload,
            "answer_tokens_at_cap": round(sum(n >= args.target_tokens for n in lengths) / len(lengths), 3),
            "answers": len(lengths),
            "answer_tokens_median": statistics.median(lengths),
            "answer_tokens_range": [min(lengths), max(lengths)],
            "verdicts": len(results),
            "model": args.model,
            "cpus": os.cpu_count(),
            "load_1min": round(os.getloadavg()[0], 2),
        },
        "bare_s": round(best["bare"], 2),
        "pipeline_s": round(best["pipeline"], 2),
        "ratio": round(best["pipeline"] / best["bare"], 3),
        "barrier_s": round(best["barrier"], 2),
        "speedup_vs_barrier": round(best["barrier"] / best["pipeline"], 3),
        "steps_streamed": min(generation_steps["streamed"]),
        "steps_barrier": min(generation_steps["barrier"]),
        "steps_lower_bound": bound,
        "streamed_over_bound": round(min(generation_steps["streamed"]) / bound, 3),
        "steps_total": {way: values for way, values in all_steps.items()},  # answers and verdicts, each run
        "prefix_cache_hit": round(cached / prompt, 3) if prompt else None,
        "judge_tokens_per_verdict": round(judge_tokens / len(results), 1),
        "runs_s": {way: [round(t, 2) for t in values] for way, values in times.items()},
    }
    if args.profile is not None:
        ways = {"pipeline": lambda: pipeline(work / "profiled"), "bare": bare}
        figures["profile"] = {way: profiled(run, args.profile.with_suffix(f".{way}.prof")) for way, run in ways.items()}
    engine.close()
    return figures


class Finished(NamedTuple):
    """A request as it finished: the engine step it finished in, its prompt, its tokens and why it stopped."""

    step: int
    prompt: str
    tokens: int
    reason: str


def kind_of(prompt: str) -> str:
    """What a request was, by its prompt: a target's answer, the grammar canary, a verdict on a control answer, or
    a verdict (a retry's prompt is its first attempt's: the workload repeats conversations, so retries are
    counted from the results)."""
    from diagsafe_local.evaluation.controls import CONTROL_ANSWERS
    from diagsafe_local.judging.canary import canary_request

    if canary_request().messages[0].content in prompt:
        return "canary"
    if "<<<" not in prompt:  # the judge's prompts hold the judged text between <<<...>>> delimiters
        return "answer"
    if any(control in prompt for control in CONTROL_ANSWERS.values()):
        return "control"
    return "verdict"


def step_trace(requests: list[Finished], before: int, after: int) -> dict[str, Any]:
    """Where one run's engine steps after its last answer go (steps counted from the run's first)."""
    rows = [(kind_of(r.prompt), r.step - before, r.tokens, r.reason) for r in requests]
    last_answer = max((row[1] for row in rows if row[0] == "answer"), default=0)
    tail = [row for row in rows if row[1] > last_answer]
    kinds: dict[str, dict[str, Any]] = {}
    for kind, at, tokens, _ in tail:
        entry = kinds.setdefault(kind, {"n": 0, "last_step": 0, "max_tokens": 0})
        entry["n"] += 1
        entry["last_step"] = max(entry["last_step"], at)
        entry["max_tokens"] = max(entry["max_tokens"], tokens)
    return {
        "steps": after - before,
        "last_answer_step": last_answer,
        "steps_after_last_answer": after - before - last_answer,
        "after_last_answer_by_kind": kinds,
        "finished_last": [
            {"kind": kind, "step": at, "tokens": tokens, "finish_reason": reason}
            for kind, at, tokens, reason in sorted(tail, key=lambda row: row[1])[-8:]
        ],
        "not_stopped": [
            {"kind": kind, "step": at, "tokens": tokens, "finish_reason": reason}
            for kind, at, tokens, reason in rows
            if kind != "answer" and reason != "stop"
        ],
    }


def profiled(run: Callable[[], Any], out: Path, top: int = 15) -> dict[str, Any]:
    """One run under cProfile: its seconds and the entries with the most time of their own (vLLM's engine core
    runs in a process of its own: the time this process waits for it is under its output queue's `get`)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    seconds = run()
    profile.disable()
    profile.dump_stats(out)
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    return {
        "seconds": round(seconds, 2),
        "top_own_seconds": [
            {"function": f"{Path(file).name}:{line}({name})", "own_s": round(own, 3), "cumulative_s": round(cum, 3)}
            for (file, line, name), (_, _, own, cum, _) in rows
        ],
    }


def report(args: argparse.Namespace, figures: dict) -> None:
    """Print the figures: one JSON object, or indented with the targets."""
    if args.json:
        print(json.dumps(figures))
        return
    print(json.dumps(figures, indent=2))
    print("targets: ratio <= 1.05, streamed_over_bound <= 1.02 (wall-time speedup_vs_barrier: see README)")


if __name__ == "__main__":
    main()
