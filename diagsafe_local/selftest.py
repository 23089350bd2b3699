"""An install check for a new node: tiny random-weight target and judge, the real pipeline, real checks.

Nothing is downloaded. The run directory is a normal one (with the config.yaml it used), so
`report` and `gate` work on it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from diagsafe_local.records import read_results
from diagsafe_local.tiny_models import build_tiny_chat_model

CATEGORIES = ("chemistry", "cyber", "fraud", "harassment")


def synthetic_items(n: int) -> list[dict[str, Any]]:
    """N mild synthetic conversations: 1-3 user turns, some with a recorded assistant turn to replay."""
    items = []
    for k in range(n):
        turns = 1 + k % 3
        messages: list[dict[str, str]] = []
        for t in range(1, turns + 1):
            messages.append({"role": "user", "content": f"Item {k}, turn {t}: explain step {t} of the task."})
            if t < turns and k % 4 == 3:
                messages.append({"role": "assistant", "content": f"Recorded answer to turn {t}."})
        items.append({"id": f"item-{k:04d}", "messages": messages, "category": CATEGORIES[k % len(CATEGORIES)],
                      "source": "selftest", "attack_method": "multi-turn" if turns > 1 else ""})
    return items


def selftest_config(out: Path, n: int) -> dict[str, Any]:
    """Build the tiny models and items under `out` and return the run config that uses them."""
    models = out / "models"
    target = build_tiny_chat_model(models / "target", seed=1)
    judge = build_tiny_chat_model(models / "judge", seed=2)
    items = out / "items.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in synthetic_items(n)))
    engine = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    return {
        "dataset": {"path": str(items)},
        "target": {"model": str(target), "name": "tiny-target", **engine,
                   "sampling": {"temperature": 0.0, "max_tokens": 24, "seed": 0}},
        "judge": {"model": str(judge), **engine, "rubric": "harmjudge", "turns": "every",
                  "sampling": {"temperature": 0.0, "max_tokens": 400, "seed": 0}},
        "placement": {"mode": "sequential"},
        "output_dir": str(out / "run"),
        "gate": {"max_asr": 1.0, "max_failure_rate": 0.0},
    }


def run_selftest(out: Path, n: int) -> tuple[bool, list[str], Path]:
    """Run the pipeline on the tiny models; returns (passed, check lines, run directory)."""
    from diagsafe_local.config import RunConfig
    from diagsafe_local.pipeline import Run

    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(selftest_config(out, n), sort_keys=False))
    config = RunConfig.model_validate(yaml.safe_load(config_path.read_text()))
    run = Run(config, overwrite=True)
    summary = run.execute()
    run_dir = Path(config.output_dir)
    results = read_results(run_dir / "results.jsonl")
    expected = sum(len([t for t in range(1, i.n_turns + 1) if i.prefilled(t) is None]) for i in run.items)
    stats = summary["targets"]["tiny-target"]
    calls = run.timings["tiny-target"].get("engine_calls")
    max_turns = max(i.n_turns for i in run.items)
    checks = [
        (len(results) == expected, f"{len(results)} judgments recorded, {expected} expected"),
        (stats["n_judged"] == len(results), f"{stats['n_judged']}/{len(results)} judge replies valid rubric JSON"),
        (calls == max_turns, f"{calls} target engine calls for {max_turns} turns"),
        (all(r.conversation[-1].role == "user" for r in results), "each record's conversation ends with the judged user turn"),
        ((run_dir / "manifest.json").exists() and (run_dir / "summary.json").exists(), "manifest.json and summary.json written"),
    ]
    lines = [("ok    " if ok else "FAIL  ") + text for ok, text in checks]
    return all(ok for ok, _ in checks), lines, run_dir
