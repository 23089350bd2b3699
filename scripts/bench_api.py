"""Benchmark (not a test): the API path through vLLM's OpenAI server versus the offline engine, on the same
workload (single-turn conversations answered, then judged), repeated so the spread shows.

The offline engine runs its repeats, is closed, then vLLM's server starts and the API path runs its repeats at
16 and 64 requests in flight (never both loaded, so neither takes the other's cores).
Throughput = (answers + judgments) per second of Run.execute (start-up excluded), default settings
otherwise. Prints the median and range of each over --repeats, the median of the per-repeat API/offline
ratios (offline repeat i against API repeat i), the 1-minute load average before and after, and where the CPU
goes: cores kept busy per wall second by this process (the client, or the offline engine's front end), the
offline engine core, and the server. Target: at 64 in flight >= 70% of offline.

With `--server scripted` it measures the client alone, against a scripted OpenAI-compatible server in a
process of its own (tests/servers.py; it answers at once, so the client is what is measured): CPU seconds of
this process per request for a bare `openai.AsyncOpenAI` loop and for our API engine's stream on the same
requests (target: ours <= 1.2x the bare loop's), and the whole harness's requests/s (`run` on the API path:
answers and verdicts, records and progress included; target >= 1,000/s), alternated, median of --repeats.

With `--server scripted --clients N` it runs the `run` command end to end on N items (an answer and a verdict
each) in one process and in the client processes the plan picks for an API-only run (placement.replicas auto:
one per 20,000 requests, at most one per CPU), and prints the whole command's requests/s for each.

Run: .venv/bin/python scripts/bench_api.py [--n 128] [--repeats 3] [--json] [--server vllm|scripted] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def spread(values: list[float]) -> dict[str, float | list[float]]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "runs": [round(v, 2) for v in values],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--server", choices=("vllm", "scripted"), default="vllm")
    parser.add_argument(
        "--clients",
        type=int,
        default=0,
        help="scripted: instead, `run` end to end on this many items (answer + verdict each), one process against "
        "the client processes the plan picks (placement.replicas auto), requests/s of the whole command",
    )
    args = parser.parse_args()
    if args.server == "scripted" and args.clients:
        print(json.dumps(measure_clients(args), indent=None if args.json else 2))
        return
    if args.server == "scripted":
        figures = measure_client(args)
        print(json.dumps(figures, indent=None if args.json else 2))
        return

    from diagsafe_local.core.console import engine_output

    work = Path(tempfile.mkdtemp(prefix=f"{Path(__file__).stem}_"))
    with engine_output(work / "engines.log"):  # the engines' own logs go there, not into the figures
        result = measure(args, work)
    report(args, result)


SERVER = """
import sys, threading
sys.path.insert(0, {tests!r})
from servers import FakeOpenAIServer
server = FakeOpenAIServer()
print(server.base_url, flush=True)
threading.Event().wait()
"""


def measure_client(args: argparse.Namespace) -> dict[str, Any]:
    """The client's CPU per request, ours against a bare loop, and the harness's requests/s (see the docstring)."""
    import subprocess

    from diagsafe_local.core.messages import Message
    from diagsafe_local.engines.base import GenerationRequest
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.openai_engine import OpenAIEngine
    from diagsafe_local.engines.streams import run_all

    tests = str(Path(__file__).resolve().parents[1] / "tests")
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(tests=tests)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    base_url = server.stdout.readline().strip()
    schema = {  # the shape of a rubric verdict's schema
        "type": "object",
        "properties": {
            "unsafe": {"type": "boolean"},
            "label": {"enum": ["harmful", "not_harmful", "uncertain"]},
            "rationale": {"type": "string", "maxLength": 400},
        },
        "required": ["unsafe", "label", "rationale"],
    }
    requests = [
        GenerationRequest(
            messages=(Message(role="user", content=f"question {k}: " + "how would one do this? " * 20),),
            max_tokens=256,
            json_schema=schema if k % 2 else None,
        )
        for k in range(args.n)
    ]
    engine = OpenAIEngine(EngineConfig(kind="openai", model="m", base_url=base_url, concurrency=64))
    bodies = [engine.request_params(r) for r in requests]
    work = Path(tempfile.mkdtemp(prefix="bench_client_"))
    figures: dict[str, list[float]] = {
        "bare_cpu_ms": [],
        "ours_cpu_ms": [],
        "bare_requests_per_s": [],
        "ours_requests_per_s": [],
        "harness_requests_per_s": [],
    }
    try:
        for repeat in range(args.repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            bare_loop(bodies, base_url, 64, phases=False)
            figures["bare_cpu_ms"].append(1000 * (time.process_time() - cpu) / args.n)
            figures["bare_requests_per_s"].append(args.n / (time.perf_counter() - wall))
            cpu, wall = time.process_time(), time.perf_counter()
            run_all(engine.open_stream(), requests)
            figures["ours_cpu_ms"].append(1000 * (time.process_time() - cpu) / args.n)
            figures["ours_requests_per_s"].append(args.n / (time.perf_counter() - wall))
            figures["harness_requests_per_s"].append(harness(work / f"run{repeat}", base_url, args.n // 2))
    finally:
        engine.close()
        server.kill()
    medians = {name: round(statistics.median(values), 3) for name, values in figures.items()}
    return {
        "requests": args.n,
        "repeats": args.repeats,
        **medians,
        "ours_over_bare": round(medians["ours_cpu_ms"] / medians["bare_cpu_ms"], 3),
        # what one core can drive through the openai client alone: no harness built on it does more per process
        "bare_client_ceiling_per_core": round(1000 / medians["bare_cpu_ms"], 1),
        "runs": {name: [round(v, 3) for v in values] for name, values in figures.items()},
        "targets": {"ours_over_bare": 1.2, "harness_requests_per_s": 1000},
        "cpus": os.cpu_count(),
    }


def measure_clients(args: argparse.Namespace) -> dict[str, Any]:
    """The whole `run` command's requests/s (start-up, shards and their merge included) in one process and in the
    client processes the plan picks, alternated, median of --repeats."""
    import subprocess

    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.planning import client_processes

    tests = str(Path(__file__).resolve().parents[1] / "tests")
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(tests=tests)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    base_url = server.stdout.readline().strip()
    work = Path(tempfile.mkdtemp(prefix="bench_clients_"))
    figures: dict[str, list[float]] = {"one_process": [], "planned": []}
    try:
        for repeat in range(args.repeats):
            for way, replicas in (("one_process", 1), ("planned", "auto")):
                out = work / f"{way}{repeat}"
                config = write_harness_config(out, base_url, args.clients, replicas)
                start = time.perf_counter()
                cli = Path(sys.executable).with_name("diagsafe-local")
                subprocess.run([str(cli), "run", str(config)], check=True, capture_output=True)
                figures[way].append(2 * args.clients / (time.perf_counter() - start))
    finally:
        server.kill()
    planned = client_processes(RunConfig.model_validate(json.loads(config.read_text())), args.clients)
    medians = {way: round(statistics.median(values), 1) for way, values in figures.items()}
    return {
        "items": args.clients,
        "requests": 2 * args.clients,
        "client_processes": planned,
        "requests_per_s": medians,
        "planned_over_one": round(medians["planned"] / medians["one_process"], 3),
        "runs": {way: [round(v, 1) for v in values] for way, values in figures.items()},
        "target_requests_per_s": 1000,
        "cpus": os.cpu_count(),
    }


def write_harness_config(out: Path, base_url: str, n: int, replicas: int | str = 1) -> Path:
    """A run of n single-turn items, target and judge behind the scripted server."""
    items = out / "items.jsonl"
    out.mkdir(parents=True)
    items.write_text("".join(json.dumps({"id": f"i{k}", "prompt": f"question {k}"}) + "\n" for k in range(n)))
    engine = {"kind": "openai", "base_url": base_url, "concurrency": 64}
    config = {
        "dataset": {"path": str(items)},
        "target": {"model": "t", "name": "t", **engine},
        "judge": {"model": "j", **engine},
        "placement": {"mode": "colocate", "replicas": replicas},
        "output_dir": str(out / "run"),
    }
    (out / "run.yaml").write_text(json.dumps(config))
    return out / "run.yaml"


def harness(out: Path, base_url: str, n: int) -> float:
    """`run` on the API path against the scripted server: (answers + verdicts) per second of generation and
    judging (the manifest's timings; start-up and the report excluded)."""
    import subprocess

    config = write_harness_config(out, base_url, n)
    cli = Path(sys.executable).with_name("diagsafe-local")
    subprocess.run([str(cli), "run", str(config)], check=True, capture_output=True)
    timings = json.loads((out / "run" / "manifest.json").read_text())["timings"]["t"]
    seconds = timings["generation_seconds"] + timings.get("judge_seconds", 0.0)
    return 2 * n / seconds


def bare_loop(params: list[dict], base_url: str, concurrency: int, phases: bool = True) -> None:
    """The recorded requests through a plain AsyncOpenAI client: answers first, then verdicts."""
    import asyncio

    from openai import AsyncOpenAI

    async def send_all() -> None:
        client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=2)  # as our engine retries
        gate = asyncio.Semaphore(concurrency)

        async def one(body: dict) -> None:
            async with gate:
                await client.chat.completions.create(**body)

        if not phases:
            await asyncio.gather(*(one(body) for body in params))
        for phase in (False, True) if phases else ():  # the default placement: every answer, then every verdict
            await asyncio.gather(*(one(body) for body in params if ("response_format" in body) == phase))
        await client.close()

    asyncio.run(send_all())


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Run every way and return the figures."""

    from servers import VLLMServer

    from diagsafe_local.engines import create_engine
    from diagsafe_local.engines.base import BorrowedEngine
    from diagsafe_local.engines.openai_engine import OpenAIEngine
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

    model = build_tiny_chat_model(work / "model")
    items = work / "items.jsonl"
    items.write_text(
        "".join(json.dumps({"id": f"q{k}", "prompt": f"Question {k}: explain step {k}."}) + "\n" for k in range(args.n))
    )
    runs = iter(range(10**6))
    server_tree: list[psutil.Process] = []
    cpu: dict[str, list[dict[str, float]]] = {"offline": [], "api_16": [], "api_64": []}
    sent: list[dict] = []  # the request arguments of the warm-up API run, for the bare loop

    def recording(config, **options):  # type: ignore[no-untyped-def]
        engine = create_engine(config, **options)
        if isinstance(engine, OpenAIEngine):
            send = engine._one

            async def one(client, gate, request):  # type: ignore[no-untyped-def]
                sent.append(engine.request_params(request))
                return await send(client, gate, request)

            engine._one = one  # type: ignore[method-assign]
        return engine

    def cpu_now() -> dict[str, float]:
        """CPU seconds so far: this process (the client, or the offline front end), its children (the offline
        engine core), and the server's processes."""

        def total(procs: list[psutil.Process]) -> float:
            return sum(sum(p.cpu_times()[:2]) for p in procs if p.is_running())

        server_pids = {p.pid for p in server_tree}
        engine = [p for p in psutil.Process().children(recursive=True) if p.pid not in server_pids]
        return {"client": time.process_time(), "offline_engine": total(engine), "server": total(server_tree)}

    def run(engine: dict, factory=None, way: str | None = None) -> float:  # type: ignore[no-untyped-def]
        config = RunConfig.model_validate(
            {
                "dataset": {"path": str(items)},
                "target": {**engine, "name": "t", "sampling": {"max_tokens": 32}},
                "judge": {**engine, "sampling": {"max_tokens": 400}},
                "output_dir": str(work / f"run{next(runs)}"),
            }
        )
        kwargs = {"engine_factory": factory} if factory else {}
        before, start = cpu_now(), time.perf_counter()
        Run(config, **kwargs).execute()
        wall = time.perf_counter() - start
        if way:
            after = cpu_now()
            cpu[way].append({k: (after[k] - before[k]) / wall for k in after})
        return 2 * args.n / wall

    local = {"model": str(model), "dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    rates: dict[str, list[float]] = {"offline": [], "api_16": [], "api_64": [], "bare_64": []}
    bare_cpu: list[float] = []
    load_before = os.getloadavg()[0]
    # One engine at a time, so neither competes with the other for the two cores.
    offline_engine = VLLMEngine(JudgeConfig(**local), structured_backend="xgrammar")
    borrowed = lambda *a, **k: BorrowedEngine(offline_engine)  # noqa: E731
    try:
        run(local, borrowed)  # warm
        for _ in range(args.repeats):
            rates["offline"].append(run(local, borrowed, "offline"))
    finally:
        offline_engine.close()
    server = VLLMServer(model).start()
    root = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
    server_tree.extend([root, *root.children(recursive=True)])
    remote = {"kind": "openai", "model": str(model), "base_url": server.base_url}
    try:
        run({**remote, "concurrency": 16}, recording)  # warm, and record what is sent
        bare_loop(sent, f"{server.base_url}", 64)  # warm the bare client's imports
        for _ in range(args.repeats):
            for c in (16, 64):
                rates[f"api_{c}"].append(run({**remote, "concurrency": c}, way=f"api_{c}"))
            cpu_before, start = time.process_time(), time.perf_counter()
            bare_loop(sent, server.base_url, 64)
            wall = time.perf_counter() - start
            rates["bare_64"].append(2 * args.n / wall)  # the same texts: its rate in our unit
            bare_cpu.append(time.process_time() - cpu_before)
    finally:
        server.stop()
    # CPU seconds of our process over each run (cores busy x wall), per request sent (retries included).
    ours_cpu = [row["client"] * (2 * args.n / rate) for row, rate in zip(cpu["api_64"], rates["api_64"])]
    result = {
        "workload": f"{args.n} single-turn conversations answered and judged (tiny random model, CPU)",
        "cpus": os.cpu_count(),
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
        **{f"{name}_texts_per_s": spread(values) for name, values in rates.items()},
        **{
            f"api_{c}_share_of_offline": spread([a / o for a, o in zip(rates[f"api_{c}"], rates["offline"])])
            for c in (16, 64)
        },
        "bare_requests": len(sent),
        "client_vs_bare": spread([a / b for a, b in zip(rates["api_64"], rates["bare_64"])]),
        "client_cpu_s_per_1000_requests": round(1000 * statistics.median(ours_cpu) / len(sent), 2),
        "bare_cpu_s_per_1000_requests": round(1000 * statistics.median(bare_cpu) / len(sent), 2),
        # Cores busy per wall second, by process group (median over repeats): where the CPU time goes.
        "cores_busy": {
            way: {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]} for way, rows in cpu.items()
        },
    }
    result["rates"] = rates
    return result


def report(args: argparse.Namespace, result: dict) -> None:
    """Print the figures: one JSON object, or a table."""
    rates = result.pop("rates")
    if args.json:
        print(json.dumps(result))
        return
    print(
        result["workload"]
        + f"; {args.repeats} repeats; load {result['load_1min_before']} -> {result['load_1min_after']}"
    )
    for name, values in rates.items():
        s = spread(values)
        print(f"{name:8s}: median {s['median']:6.1f} texts/s  (range {s['min']:.1f}-{s['max']:.1f})")
    for c in (16, 64):
        s = result[f"api_{c}_share_of_offline"]
        print(
            f"API at {c} in flight: median {100 * s['median']:.0f}% of offline "
            f"(range {100 * s['min']:.0f}-{100 * s['max']:.0f}%)"
        )
    s = result["client_vs_bare"]
    print(
        f"our API engine vs a bare AsyncOpenAI loop, 64 in flight: median {s['median']:.2f} "
        f"(range {s['min']:.2f}-{s['max']:.2f}; target >= 0.95); client CPU s per 1000 requests: "
        f"ours {result['client_cpu_s_per_1000_requests']}, bare {result['bare_cpu_s_per_1000_requests']}"
    )
    print("target: 64 in flight >= 70% of offline")


if __name__ == "__main__":
    main()
