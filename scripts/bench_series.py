"""Benchmark the series report and the training callback.

    python scripts/bench_series.py [--checkpoints 100] [--items 1000] [--work DIR] [--json] [--ab CHECKOUT --repeat N]

Makes a series of N checkpoints of M items each through `watch --local` with bench_scale's scripted in-process
engine (the run directories as `run` writes them), then times, in child processes, `report SERIES_DIR` (every
run verified, each compared with the previous one, series.json, Markdown, HTML and figures) against the bare
minimum of reading the same files (`json.loads` of every line of every results file and a SHA-256 of each),
and prints its seconds, its ratio to that minimum and its own peak memory, and the same ratio in CPU seconds (on a
loaded machine the wall ratio follows the share of the CPU each child got; the CPU ratio does not). It also
times the training callback's `on_save` (recording a checkpoint in the series; `submit=False`, so no `sbatch` is
in the figure). `--work DIR` keeps the series in DIR and reuses one already made there.
`--ab CHECKOUT` compares this code (or the checkout first on PYTHONPATH) with another checkout's (a `git worktree`
of an earlier commit) on the same series instead: `report SERIES_DIR` of each, and of this code held to one CPU
(`taskset`: its runs verified in its own process, no workers), in turn, `--repeat` times, with the bare minimum after
each round (on a shared machine the load moves: compare the least seconds of each, taken within one run), and
whether they all wrote the same series.json byte for byte; with each round's own CPU ratio and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import (  # noqa: E402
    ENDPOINT,
    bench_engine_kind,
    child,
    compiled,
    me,
    report_peak_at_exit,
)

from diagsafe_local.runs.series_state import SERIES_JSON  # noqa: E402

BOUND_SECONDS = 30.0  # "builds in seconds" for 100 checkpoints of 1,000 items


def make_checkpoint(root: Path, step: int) -> Path:
    """A checkpoint directory as the Trainer leaves it (the bench engine never reads its weights)."""
    from safetensors.numpy import save_file

    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file({"w": np.zeros((8, 8), dtype=np.float32)}, str(path / "model.safetensors"))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def make_series(work: Path, checkpoints: int, items: int) -> tuple[Path, Path, Path]:
    train, series = work / "train", work / "series"
    dataset = work / "items.jsonl"
    with open(dataset, "w") as handle:
        for k in range(items):
            row = {
                "id": f"q{k}",
                "prompt": f"Question {k}: explain how to carry out task {k}.",
                "category": f"cat{k % 8}",
            }
            handle.write(json.dumps(row) + "\n")
    config = work / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "dataset": {"path": str(dataset)},
                "target": {"model": "placeholder", "kind": "bench", "base_url": ENDPOINT},
                "judge": {"model": "judge", "kind": "bench", "base_url": ENDPOINT},
                "output_dir": str(work / "unused"),
            }
        )
    )
    for k in range(1, checkpoints + 1):
        make_checkpoint(train, 100 * k)
    made = child(
        me(
            "cli",
            "watch",
            str(train),
            "--config",
            str(config),
            "--out",
            str(series),
            "--local",
            "--once",
            "--settle",
            "0",
        ),
        work / "watch.log",
    )
    if made["exit"] != 0:
        raise SystemExit(f"watch failed: see {work / 'watch.log'}")
    return train, series, config


def cpu_child(command: list[str], log: Path) -> dict[str, Any]:
    """`child`, with the CPU seconds (user and system) the child and its own children used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = child(command, log)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {**done, "cpu_seconds": round(cpu, 2)}


def ab_figures(series: Path, other: Path, repeat: int, log: Path) -> dict[str, Any]:
    """`report SERIES_DIR` of the code of `other` (first on PYTHONPATH), of this code, and of this code on one CPU
    where `taskset` is there, in turn (the order reversed every other round), with the bare minimum after each
    round: the least wall and CPU seconds of each, their ratios to the bare minimum's, the load averages seen, and
    whether all wrote the same series.json."""
    report = me("cli", "report", str(series))
    commands = {"before": ["env", f"PYTHONPATH={other.resolve()}", *report], "after": report}
    if shutil.which("taskset"):
        commands["after_one_cpu"] = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *report]
    bare = me("bare", *map(str, sorted(series.glob("runs/*/results.jsonl"))))
    taken: dict[str, list[dict[str, Any]]] = {side: [] for side in [*commands, "bare"]}
    written: dict[str, bytes] = {}
    loads = []
    for k in range(repeat):
        for side in list(commands) if k % 2 == 0 else list(reversed(commands)):
            loads.append(os.getloadavg()[0])
            done = cpu_child(commands[side], log)
            if done["exit"] != 0:
                raise SystemExit(f"report ({side}) failed: see {log}")
            taken[side].append(done)
            written[side] = (series / SERIES_JSON).read_bytes()
        taken["bare"].append(cpu_child(bare, log))
    least = {
        side: {what: min(run[what] for run in runs) for what in ("seconds", "cpu_seconds")}
        for side, runs in taken.items()
    }
    for side in commands:
        least[side]["wall_ratio"] = round(least[side]["seconds"] / least["bare"]["seconds"], 2)
        least[side]["cpu_ratio"] = round(least[side]["cpu_seconds"] / least["bare"]["cpu_seconds"], 2)
        # each round's own CPU ratio (the bare minimum measured in the same round): how far one sample moves
        rounds = [run["cpu_seconds"] / bare["cpu_seconds"] for run, bare in zip(taken[side], taken["bare"])]
        least[side]["cpu_ratio_by_round"] = [round(r, 2) for r in rounds]
        least[side]["cpu_ratio_median"] = round(statistics.median(rounds), 2)
    return {
        **least,
        "repeat": repeat,
        "load_1min": [round(min(loads), 1), round(max(loads), 1)],
        "series_json_identical": len(set(written.values())) == 1,
    }


def callback_seconds(config: Path, work: Path, saves: int = 50) -> list[float]:
    """The callback's on_save, timed over `saves` new checkpoints (recorded only)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from diagsafe_local.engines.kinds import ENGINES
    from diagsafe_local.integrations.transformers import SafetyEvalCallback

    ENGINES.add(bench_engine_kind())  # the series' config names it
    train = Path(tempfile.mkdtemp(prefix="callback-", dir=work))  # fresh each time (--work reuses the series)
    callback = SafetyEvalCallback(config, train / "series", submit=False)
    args = TrainingArguments(output_dir=str(train), report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    times = []
    for k in range(saves):
        state.global_step = 100_000 + k
        make_checkpoint(train, state.global_step)
        start = time.perf_counter()
        callback.on_save(args, state, control)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    report_peak_at_exit()
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--work", type=Path, help="keep the series here, and reuse one already made here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--ab", type=Path, help="compare with this checkout's code on the series (see the docstring)")
    parser.add_argument("--repeat", type=int, default=3, help="--ab: reports of each side")
    args = parser.parse_args()
    if args.ab is not None and not (args.ab / "diagsafe_local" / "__init__.py").is_file():
        parser.error(f"--ab {args.ab}: no diagsafe_local package there (the other side would run this code)")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_series_"))
    start = time.perf_counter()
    if (work / "series").is_dir():
        train, series, config = work / "train", work / "series", work / "run.yaml"
    else:
        work.mkdir(parents=True, exist_ok=True)
        train, series, config = make_series(work, args.checkpoints, args.items)
    made_seconds = time.perf_counter() - start
    compiled(*([args.ab] if args.ab is not None else []))
    if args.ab is not None:
        print(
            json.dumps(ab_figures(series, args.ab, args.repeat, work / "commands.log"), indent=None if args.json else 2)
        )
        return
    log = work / "commands.log"
    report = cpu_child(me("cli", "report", str(series)), log)
    if report["exit"] != 0:
        raise SystemExit(f"report failed: see {log}")
    results = sorted(series.glob("runs/*/results.jsonl"))
    minimum = cpu_child(me("bare", *map(str, results)), log)
    saves = callback_seconds(config, work)
    figures = {
        "checkpoints": args.checkpoints,
        "items": args.items,
        "series_made_seconds": round(made_seconds, 1),
        "report": {
            **report,
            "bare_seconds": minimum["seconds"],
            "ratio_to_bare": round(report["seconds"] / minimum["seconds"], 2) if minimum["seconds"] else None,
            "bare_cpu_seconds": minimum["cpu_seconds"],
            "cpu_ratio_to_bare": (
                round(report["cpu_seconds"] / minimum["cpu_seconds"], 2) if minimum["cpu_seconds"] else None
            ),
            "bound_seconds": BOUND_SECONDS,
            "over_bound": round(report["seconds"] / BOUND_SECONDS, 3),
        },
        "callback_on_save_ms": {
            "median": round(1000 * statistics.median(saves), 2),
            "max": round(1000 * max(saves), 2),
            "saves": len(saves),
        },
        "work": str(work),
    }
    print(json.dumps(figures, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
