"""Benchmark (not a test): the read side at 10k, 100k and 1M answers, each command against the bare minimum.

For each size N it makes two real run directories through `run` (a sweep of 10 targets x N/100 prompts x 10
samples): a scripted in-process engine kind (`bench`, registered as a plugin kind would be) answers and judges,
so the records are exactly what `run` writes and they verify like any run. The candidate is one `run` (its time
and peak memory are the harness's at the full size); the baseline, other checkpoints on the same prompts, is
made in 16 shards and merged with `merge`, as a sharded run is (`--flipped-baseline`: made from the candidate
instead, two in three of its verdicts flipped, in minutes where a million answers' shards take an hour here).

Then each command runs in a child process of its own, timed, its peak memory the child's own high-water mark
(`VmHWM`, which it writes as it exits; rusage's maxrss would also count the parent it was forked from): `merge` (16 shards into one), `gate`, `report`, `compare` (the two runs). The bare minimum of a
command is `json.loads` of every line plus SHA-256 of each file it reads, in a child of its own too; the ratio
is the command's seconds over it. Bounds: memory <= 1 GB for each but compare, <= 0.3 GB (GB here: VmHWM's KiB
/ 1024^2); ratio <= 5 for gate and merge, <= 8 for report and compare. Making the runs is timed too (`run`, its memory: the harness, bound 1.5 GB at 1M).

Run: .venv/bin/python scripts/bench_scale.py [--sizes 10000 100000 1000000] [--commands gate report compare]
[--json] [--work DIR [--keep]] [--flipped-baseline]. `--commands` picks the commands measured on the runs (`merge` always is, but for
`--flipped-baseline`: it makes the baseline); `--keep` leaves each size's runs in `--work DIR` and uses runs already there instead of making them.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SHARDS = 16
TARGETS = 10
SAMPLES = 10
COMMANDS = ("gate", "report", "compare")  # measured on the two runs (merge, which makes the baseline, always is)
BOUNDS = {"gate": 5.0, "merge": 5.0, "report": 8.0, "compare": 8.0}
MEMORY_GB = {"run": 1.5, "gate": 1.0, "merge": 1.0, "report": 1.0, "compare": 0.3}
MARKER = "<<<ANSWER TO JUDGE>>>"
ENDPOINT = "http://bench.invalid/v1"  # a remote kind names its endpoint; the bench engine never calls it


# -- the scripted engine kind, and `run` with it (in a child: `bench_scale.py cli ...`) -------------------------


def _number(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("|".join(parts).encode(), digest_size=8).digest(), "big")


def bench_engine_kind() -> Any:
    """An engine kind answering at once: targets comply or refuse by a hash of (model, prompt); the judge calls
    a complying answer harmful, uncertain or not by a hash of the answer (varied rationales: a healthy judge)."""
    from diagsafe_local.engines.base import Completion, EngineBase, EngineInfo, GenerationRequest
    from diagsafe_local.engines.kinds import Capabilities, EngineKind
    from diagsafe_local.judging.canary import CANARY_SCHEMA, CANARY_VALUE

    class BenchEngine(EngineBase):
        def __init__(self, config: Any, **_: Any) -> None:
            self.info = EngineInfo(kind="bench", model=config.model)
            self.calls = 0

        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            self.calls += 1
            return [self._one(r) for r in requests]

        def _one(self, request: GenerationRequest) -> Completion:
            last = request.messages[-1].content
            if request.json_schema == CANARY_SCHEMA:  # it applies schemas, as a real engine does
                text = json.dumps({"canary": CANARY_VALUE, "digits": "042042"})
                return Completion(text=text, finish_reason="stop", prompt_tokens=20, completion_tokens=14)
            if request.json_schema is None:
                h = _number(self.info.model, last)
                if h % 5 == 0:
                    text = "I'm sorry, but I can't help with that request."
                else:
                    text = f"Sure, here is a detailed answer ({h % 1000}): " + " ".join(
                        f"step {k}: do part {(h >> k) % 97} carefully." for k in range(24)
                    )
                return Completion(text=text, finish_reason="stop", prompt_tokens=40, completion_tokens=len(text) // 4)
            answer = last.split(MARKER)[1] if MARKER in last else last
            h = _number(answer)
            harmful = "Sure" in answer and h % 3 != 0
            label = "uncertain" if "Sure" in answer and h % 41 == 0 else "harmful" if harmful else "not_harmful"
            verdict = {
                "unsafe": harmful,
                "relevant": "Sure" in answer,
                "useful": harmful,
                "label": label,
                "rationale": f"the answer {'gives' if harmful else 'withholds'} concrete steps (case {h % 9973})",
            }
            return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=300, completion_tokens=40)

        def close(self) -> None:
            return None

    return EngineKind("bench", "benchmark: scripted, in-process", BenchEngine, Capabilities(local=False, remote=True))


def cli_with_bench_engine(arguments: list[str]) -> None:
    """The CLI, with the `bench` engine kind registered."""
    from diagsafe_local import cli
    from diagsafe_local.engines.kinds import ENGINES

    ENGINES.add(bench_engine_kind())
    sys.argv = ["diagsafe-local", *arguments]
    cli.main()


# -- measuring ----------------------------------------------------------------------------------------------


PEAK_FILE = "BENCH_PEAK_FILE"  # where a child of ours writes its peak memory (kB) as it exits


def own_peak_kb() -> int:
    """This process's own peak resident memory since its exec (`VmHWM`). Not rusage's maxrss: Linux carries
    the address space a child was (v)forked from into it at exec, so a child of a large process (pytest
    holding an engine) would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def report_peak_at_exit() -> None:
    if path := os.environ.get(PEAK_FILE):
        atexit.register(lambda: Path(path).write_text(str(own_peak_kb())))


def measured_child(command: list[str], **popen: Any) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """Run one of our commands (`me(...)`) to its end: the finished process and its own peak memory (MB)."""
    with tempfile.TemporaryDirectory() as scratch:
        peak = Path(scratch) / "peak"
        done = subprocess.run(command, env={**os.environ, PEAK_FILE: str(peak), **popen.pop("env", {})}, **popen)
        return done, int(peak.read_text()) / 1024 if peak.exists() else float("nan")


def child(command: list[str], log: Path) -> dict[str, Any]:
    """Run one command in a child process: its seconds, peak memory (GB) and exit code."""
    start = time.perf_counter()
    with open(log, "ab") as out:
        done, peak_mb = measured_child(command, stdout=out, stderr=subprocess.STDOUT)
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "peak_gb": round(peak_mb / 1024, 3),
        "exit": done.returncode,
    }


def bare(paths: Sequence[Path]) -> None:
    """The bare minimum a command on these files must do: json.loads of every line, SHA-256 of each file."""
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for line in handle:
                digest.update(line)
                if line.strip():
                    json.loads(line)


def compiled(*others: Path) -> None:
    """The package this process imports, and each other checkout's, compiled to bytecode before anything is timed,
    as an installed wheel has it (pip compiles at install). A checkout is installed editable and nothing compiles
    it: where the environment sets PYTHONDONTWRITEBYTECODE, every child would compile each module it imports again
    (~0.3 CPU s of a series report, measured in stop 54), a cost no user's command pays."""
    import diagsafe_local

    for package in (Path(diagsafe_local.__file__).parent, *(other / "diagsafe_local" for other in others)):
        compileall.compile_dir(package, quiet=1)


def me(*arguments: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *arguments]


def write_config(work: Path, name: str, items: Path, suffix: str) -> Path:
    config = {
        "dataset": {"path": str(items)},
        "targets": [
            {
                "name": f"ckpt{k}",
                "model": f"ckpt{k}{suffix}",
                "kind": "bench",
                "base_url": ENDPOINT,
                "sampling": {"n": SAMPLES},
            }
            for k in range(TARGETS)
        ],
        "judge": {"model": "judge", "kind": "bench", "base_url": ENDPOINT},
        "placement": {"replicas": 1},  # one process: the harness's own memory at the full size
        "output_dir": str(work / name),
    }
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return path


def measure(size: int, work: Path, commands: Sequence[str], flipped: bool = False) -> dict[str, Any]:
    """The two runs of `size` answers (made here unless `work` holds them) and the figures of `commands` on them."""
    runs = {"candidate": work / "candidate", "baseline": work / "baseline-merged"}
    log = work / "commands.log"
    made = all(p.is_dir() for p in runs.values())
    figures = make_runs(size, work, log, flipped) if not made else {"runs": "reused"}
    results = runs["candidate"] / "results.jsonl"
    figures["results_mb"] = round(results.stat().st_size / 1e6, 1)
    if "gate" in commands:
        figures["gate"] = timed(me("cli", "gate", str(runs["candidate"]), "--max-asr", "1"), [results], log)
    if "report" in commands:
        figures["report"] = timed(me("cli", "report", str(runs["candidate"])), [results], log)
    if "compare" in commands:
        both = [results, runs["baseline"] / "results.jsonl"]
        compare = me("cli", "compare", str(runs["baseline"]), str(runs["candidate"]), "--json")
        figures["compare"] = timed(compare, both, log)
    return figures


def make_runs(size: int, work: Path, log: Path, flipped: bool = False) -> dict[str, Any]:
    """The candidate in one `run` (the harness's memory at the full size) and the baseline in shards merged by
    `merge` (timed against the bare minimum), or with `flipped` made from the candidate (`flipped_baseline`), in
    `work`: their figures."""
    work.mkdir(parents=True, exist_ok=True)
    n_items = max(1, size // (TARGETS * SAMPLES))
    items = work / "items.jsonl"
    with open(items, "w") as handle:
        for k in range(n_items):
            prompt = f"Question {k}: explain, step by step, how one would carry out task {k} " + "in detail. " * 8
            handle.write(json.dumps({"id": f"q{k}", "prompt": prompt, "category": f"cat{k % 12}"}) + "\n")
    figures: dict[str, Any] = {"answers": n_items * TARGETS * SAMPLES, "items": n_items}
    candidate = write_config(work, "candidate", items, "")
    made = child(me("cli", "run", str(candidate)), log)
    if made["exit"] != 0:
        raise SystemExit(f"run failed: see {log}")
    figures["run"] = {**made, "answers_per_second": round(figures["answers"] / made["seconds"], 1)}
    if flipped:
        figures["baseline_flipped"] = flipped_baseline(work / "candidate", work / "baseline-merged")
        return figures
    baseline = write_config(work, "baseline", items, "-old")
    for k in range(SHARDS):
        if child(me("cli", "run", str(baseline), "--shard", f"{k}/{SHARDS}"), log)["exit"] != 0:
            raise SystemExit(f"run shard {k} failed: see {log}")
    shard_dirs = sorted((work / "baseline" / "shards").iterdir())
    shard_files = [d / f for d in shard_dirs for f in ("results.jsonl", "generations.jsonl")]
    merged = work / "baseline-merged"
    figures["merge"] = timed(me("cli", "merge", *map(str, shard_dirs), "--out", str(merged)), shard_files, log)
    if figures["merge"]["exit"] != 0:
        raise SystemExit(f"merge failed: see {log}")
    shutil.rmtree(work / "baseline")  # the shards are not needed again: their disk goes back
    return figures


def flipped_baseline(source: Path, out: Path) -> int:
    """A baseline made from a finished run in minutes, not by running again (a million answers' shards take an
    hour here): a copy of it (hard links) whose verdicts are flipped, harmful and not harmful, judge_raw, verdict
    and score together, on the answers a hash picks (two in three), its summary.json recomputed by `verify_run`.
    It verifies as its source does; a comparison with its source has ~2/3 of its answers in disagreement. Returns
    the verdicts flipped."""
    from diagsafe_local.runs import files
    from diagsafe_local.runs.rederive import score_rule
    from diagsafe_local.runs.verify import verify_run

    out.mkdir()
    for path in source.iterdir():
        if path.is_file() and path.name not in (files.RESULTS, files.SUMMARY, ".diagsafe.lock"):
            os.link(path, out / path.name)
    rule, flipped = score_rule("harmjudge"), 0
    with open(source / files.RESULTS, "rb") as read, open(out / files.RESULTS, "w", encoding="utf-8") as write:
        for line in read:
            r = json.loads(line)
            verdict, key = r["verdict"], "|".join(str(r[k]) for k in ("target", "item_id", "sample", "turn"))
            if verdict and verdict.get("label") in ("harmful", "not_harmful") and _number(key) % 3:
                harmful = verdict["label"] == "not_harmful"
                changed = {"unsafe": harmful, "useful": harmful, "label": "harmful" if harmful else "not_harmful"}
                r["verdict"] = {**verdict, **changed}
                r["judge_raw"] = json.dumps({**json.loads(r["judge_raw"]), **changed})
                r["score"] = rule.rule.of(r["verdict"]) if rule is not None else None
                flipped += 1
            write.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    shutil.copyfile(source / files.SUMMARY, out / files.SUMMARY)  # its figures recomputed below
    checked = verify_run(out)
    summary = checked.summary.model_copy(update={"results_sha256": checked.results_sha256})
    (out / files.SUMMARY).write_text(summary.model_dump_json(indent=2))
    problems = verify_run(out).problems
    if problems:
        raise SystemExit(f"the flipped baseline does not verify: {problems[:3]}")
    return flipped


def timed(command: list[str], files: list[Path], log: Path) -> dict[str, Any]:
    """A command's figures and its ratio to the bare minimum on the files it reads."""
    measured = child(command, log)
    minimum = child(me("bare", *map(str, files)), log)
    return {
        **measured,
        "bare_seconds": minimum["seconds"],
        "ratio": round(measured["seconds"] / minimum["seconds"], 2) if minimum["seconds"] else None,
    }


def main() -> None:
    report_peak_at_exit()
    if len(sys.argv) > 1 and sys.argv[1] == "cli":
        cli_with_bench_engine(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare([Path(p) for p in sys.argv[2:]])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--commands", nargs="*", choices=COMMANDS, default=list(COMMANDS), help="what to measure")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the runs in --work, and use those already there")
    parser.add_argument(
        "--flipped-baseline",
        action="store_true",
        help="make the baseline from the candidate (two in three verdicts flipped; `flipped_baseline`) instead of 16 "
        "shards merged: minutes instead of an hour at a million answers; merge is then not measured",
    )
    args = parser.parse_args()
    if args.keep and args.work is None:
        parser.error("--keep needs --work")
    root = args.work or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    compiled()
    table = {}
    for size in args.sizes:
        table[str(size)] = measure(size, root / str(size), args.commands, args.flipped_baseline)
        if not args.keep:
            shutil.rmtree(root / str(size))
        if not args.json:
            print(json.dumps({str(size): table[str(size)]}, indent=2), flush=True)
    result = {"bounds": {"ratio": BOUNDS, "memory_gb": MEMORY_GB}, "sizes": table}
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
