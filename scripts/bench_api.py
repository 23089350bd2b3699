"""Benchmark (not a test): the API path at concurrency 1, 16 and 64 against a local vLLM server, versus
the offline engine, on the same workload (single-turn conversations answered, then judged).

Throughput = (answers + judgments) per second of Run.execute (engine/server start-up excluded).
Concurrency 1 runs on a subset (a rate needs no extrapolation). Target: at concurrency 64 the API
path reaches >= 70% of the offline throughput.

Run: .venv/bin/python scripts/bench_api.py [--n 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--n-serial", type=int, default=24, help="conversations for concurrency 1")
    args = parser.parse_args()

    from servers import VLLMServer

    from diagsafe_local.engines.base import BorrowedEngine
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

    work = Path(tempfile.mkdtemp(prefix="bench_api_"))
    model = build_tiny_chat_model(work / "model")

    def items(n: int) -> Path:
        path = work / f"items{n}.jsonl"
        path.write_text(
            "".join(json.dumps({"id": f"q{k}", "prompt": f"Question {k}: explain step {k}."}) + "\n" for k in range(n))
        )
        return path

    def run(engine: dict, n: int, name: str, factory=None) -> float:  # type: ignore[no-untyped-def]
        config = RunConfig.model_validate(
            {
                "dataset": {"path": str(items(n))},
                "target": {**engine, "name": "t", "sampling": {"max_tokens": 32}},
                "judge": {**engine, "sampling": {"max_tokens": 400}, "batch_size": 100_000},
                "output_dir": str(work / name),
            }
        )
        kwargs = {"engine_factory": factory} if factory else {}
        start = time.perf_counter()
        Run(config, **kwargs).execute()
        return 2 * n / (time.perf_counter() - start)

    local = {"model": str(model), "dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    offline_engine = VLLMEngine(JudgeConfig(**local), structured_backend="xgrammar")

    run(local, 8, "warm", lambda *a, **k: BorrowedEngine(offline_engine))
    offline = run(local, args.n, "offline", lambda *a, **k: BorrowedEngine(offline_engine))
    offline_engine.close()

    server = VLLMServer(model).start()
    try:
        remote = {"kind": "openai", "model": str(model), "base_url": server.base_url}
        run({**remote, "concurrency": 8}, 8, "warm-api")
        rates = {
            c: run({**remote, "concurrency": c}, args.n_serial if c == 1 else args.n, f"api{c}") for c in (1, 16, 64)
        }
    finally:
        server.stop()
    print(f"workload: {args.n} single-turn conversations answered and judged (tiny model, CPU)")
    print(f"offline vLLM engine          : {offline:7.1f} texts/s")
    for c, rate in rates.items():
        print(f"API path, concurrency {c:3d}   : {rate:7.1f} texts/s  ({100 * rate / offline:5.1f}% of offline)")
    print("target: concurrency 64 >= 70% of offline")


if __name__ == "__main__":
    main()
