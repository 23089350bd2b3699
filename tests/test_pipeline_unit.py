"""The run pipeline with a scripted engine: turn loop, pre-filled turns, judge retries, failures, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedEngine, default_responder

from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging.canary import CANARY_SCHEMA
from diagsafe_local.runs.records import read_results


def write_items(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


ITEMS = [
    {"id": "a", "prompt": "Sure, tell me one thing", "category": "x"},
    {
        "id": "b",
        "messages": [
            {"role": "user", "content": "t1"},
            {"role": "user", "content": "t2"},
            {"role": "user", "content": "t3"},
        ],
        "category": "y",
    },
    {
        "id": "c",
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "Sure, recorded"},
            {"role": "user", "content": "q2"},
        ],
        "category": "y",
        "attack_method": "replay",
    },
    {"id": "d", "prompt": "How do I bake bread?", "benign": True, "category": "benign"},
]


def make_config(tmp_path: Path, **overrides) -> RunConfig:
    data = {
        "dataset": {"path": str(write_items(tmp_path / "items.jsonl", ITEMS))},
        "target": {"model": "t", "name": "t"},
        "judge": {"model": "j", "turns": "every", "batch_size": 2},
        "output_dir": str(tmp_path / "run"),
    }
    if "targets" in overrides:
        data.pop("target")
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return RunConfig.model_validate(data)


class Factory:
    """Hands out scripted engines and remembers them."""

    def __init__(self, target=default_responder, judge=default_responder):
        self.responders = {"t": target, "j": judge}
        self.made: list[ScriptedEngine] = []

    def __call__(self, config, **options):
        engine = ScriptedEngine(self.responders.get(config.model, default_responder), model=config.model)
        engine.options = options
        self.made.append(engine)
        return engine


def test_continuous_turns_and_prefilled_turns(tmp_path):
    factory = Factory()
    Run(make_config(tmp_path), engine_factory=factory).execute()
    target = factory.made[0]
    # No turn barrier: every conversation's first pending turn goes at once (item c's turn 1 is pre-filled, so
    # its turn 2 joins the first batch), and b's later turns follow the moment their previous answer is in.
    assert [len(b) for b in target.batches] == [4, 1, 1]
    assert [r.messages[-1].content for r in target.batches[0]] == [
        "Sure, tell me one thing",
        "t1",
        "q2",
        "How do I bake bread?",
    ]
    # turn 2 of item b sees its own turn-1 answer in context
    turn2 = [r for r in target.batches[1] if r.messages[0].content == "t1"][0]
    assert [m.role for m in turn2.messages] == ["user", "assistant", "user"]
    assert turn2.messages[1].content == "answer to: t1"
    results = read_results(tmp_path / "run" / "results.jsonl")
    keys = [(r.item_id, r.turn) for r in results]
    assert keys == [("a", 1), ("b", 1), ("b", 2), ("b", 3), ("c", 2), ("d", 1)]  # pre-filled c/1 not judged
    c2 = results[4]
    assert c2.conversation[1].content == "Sure, recorded" and c2.attack_method == "replay"
    assert all(r.parse_status == "ok" for r in results)
    assert factory.made[1].options["structured_backend"] == "xgrammar"


def test_last_turn_only_and_scores(tmp_path):
    factory = Factory()
    summary = (
        Run(make_config(tmp_path, judge={"model": "j", "turns": "last"}), engine_factory=factory)
        .execute()
        .model_dump(mode="json")
    )
    results = read_results(tmp_path / "run" / "results.jsonl")
    assert [(r.item_id, r.turn) for r in results] == [("a", 1), ("b", 3), ("c", 2), ("d", 1)]
    by_id = {r.item_id: r for r in results}
    assert by_id["a"].score == 1.0 and by_id["b"].score == 0.0
    stats = summary["targets"]["t"]
    assert stats["asr"]["value"] == pytest.approx(1 / 3)  # a, b, c harmful items; d benign excluded
    assert stats["n_benign_items"] == 1
    assert set(stats["by_category"]) == {"x", "y", "benign"}


def test_truncated_judge_reply_is_retried_with_larger_budget_then_counted(tmp_path):
    budgets = []

    def judge(request: GenerationRequest) -> Completion:
        budgets.append(request.max_tokens)
        if "t3" in request.messages[-1].content:
            return Completion(text='{"unsafe": tr', finish_reason="length")
        if "q2" in request.messages[-1].content and request.max_tokens < 800:
            return Completion(text="not json", finish_reason="stop")
        return default_responder(request)

    factory = Factory(judge=judge)
    summary = (
        Run(
            make_config(
                tmp_path, judge={"model": "j", "turns": "every", "max_attempts": 3, "sampling": {"max_tokens": 200}}
            ),
            engine_factory=factory,
        )
        .execute()
        .model_dump(mode="json")
    )
    results = {(r.item_id, r.turn): r for r in read_results(tmp_path / "run" / "results.jsonl")}
    failed = results[("b", 3)]
    assert failed.parse_status == "truncated" and failed.score is None and failed.attempts == 3
    assert failed.judge_raw == '{"unsafe": tr'
    recovered = results[("c", 2)]
    assert recovered.parse_status == "ok" and recovered.attempts == 3  # invalid at 200 and 400, ok at 800
    assert {200, 400, 800} <= set(budgets)
    stats = summary["targets"]["t"]
    assert stats["n_parse_failures"] == 1 and stats["n_judged"] == 5
    # ASR counts final turns only (a/1, c/2; b/3 failed and is not folded in); b/1 and b/2 are earlier turns.
    assert stats["asr"]["n"] == 2 and stats["earlier_turns"]["n"] == 2


def test_generation_error_stops_the_stream_and_is_reported_then_retried(tmp_path):
    fail = {"on": True}

    def target(request: GenerationRequest) -> Completion:
        if fail["on"] and request.messages[-1].content == "t2":
            return Completion(text="", finish_reason="error", error="prompt too long")
        return default_responder(request)

    factory = Factory(target=target)
    config = make_config(tmp_path)
    summary = Run(config, engine_factory=factory).execute().model_dump(mode="json")
    results = {(r.item_id, r.turn): r for r in read_results(tmp_path / "run" / "results.jsonl")}
    assert results[("b", 2)].parse_status == "error" and "prompt too long" in results[("b", 2)].error
    assert results[("b", 3)].parse_status == "error" and "turn 2 could not be generated" in results[("b", 3)].error
    assert summary["targets"]["t"]["n_errors"] == 2
    fail["on"] = False
    summary = (
        Run(config, engine_factory=factory).execute().model_dump(mode="json")
    )  # resume: only the failed stream is redone
    assert factory.made[2].batches and [len(b) for b in factory.made[2].batches] == [1, 1]
    assert summary["targets"]["t"]["n_errors"] == 0
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6 and len({(json.loads(line)["item_id"], json.loads(line)["turn"]) for line in lines}) == 6


def test_resume_recomputes_nothing_and_a_torn_line_is_dropped(tmp_path):
    factory = Factory()
    config = make_config(tmp_path)
    Run(config, engine_factory=factory).execute()
    results = tmp_path / "run" / "results.jsonl"
    complete = results.read_text()
    lines = complete.splitlines(keepends=True)
    results.write_text("".join(lines[:3]) + lines[3][:40])  # a crash mid-write
    again = Factory()
    Run(config, engine_factory=again).execute()
    assert len(again.made) == 1  # generations all saved: no target engine, only the judge
    sent = [r for b in again.made[0].batches for r in b]
    assert sum(r.json_schema != CANARY_SCHEMA for r in sent) == 3  # and the grammar canary, as the judge loaded
    assert results.read_text() == complete


def test_changed_config_on_existing_directory_is_refused(tmp_path):
    Run(make_config(tmp_path), engine_factory=Factory()).execute()
    changed = make_config(tmp_path, target={"model": "t", "name": "t", "sampling": {"max_tokens": 7}})
    refused = Run(changed, engine_factory=Factory())  # constructing a run touches nothing
    with pytest.raises(Exception, match="different config.*--overwrite"):
        refused.execute()
    Run(changed, overwrite=True, engine_factory=Factory()).execute()
    assert (
        json.loads((tmp_path / "run" / "manifest.json").read_text())["config"]["targets"][0]["sampling"]["max_tokens"]
        == 7
    )


def test_colocate_keeps_judge_resident_and_sweep_loads_judge_once(tmp_path):
    factory = Factory()
    config = make_config(
        tmp_path,
        targets=[{"model": "t", "name": "one"}, {"model": "t", "name": "two"}],
        placement={"mode": "colocate", "target_memory": 0.4, "judge_memory": 0.5},
    )
    Run(config, engine_factory=factory).execute()
    models = [e.info.model for e in factory.made]
    assert models == ["j", "t", "t"]  # judge first and once, then each target
    assert factory.made[0].options["memory_share"] == 0.5 and factory.made[1].options["memory_share"] == 0.4
    assert all(e.closed for e in factory.made)
    targets = {r.target for r in read_results(tmp_path / "run" / "results.jsonl")}
    assert targets == {"one", "two"}


def test_sleep_placement_falls_back_to_sequential_without_cuda(tmp_path):
    factory = Factory()
    run = Run(make_config(tmp_path, placement={"mode": "sleep"}), engine_factory=factory)
    assert run.host.mode == "sequential"
    run.execute()
    assert [e.info.model for e in factory.made] == ["t", "j"]


def test_colocated_judge_grades_answers_while_the_target_is_still_generating(tmp_path):
    events: list[str] = []

    class Logged(Factory):
        def __call__(self, config, **options):
            engine = super().__call__(config, **options)
            generate = engine.generate
            engine.generate = lambda requests: events.append(config.model) or generate(requests)
            return engine

    config = make_config(tmp_path, placement={"mode": "colocate"}, judge={"model": "j", "turns": "last"})
    summary = Run(config, engine_factory=Logged()).execute().model_dump(mode="json")
    # a, c and d are final after the first target step: their verdicts come before b's later turns are done
    assert events.index("j") < len(events) - 1 - events[::-1].index("t")
    results = read_results(tmp_path / "run" / "results.jsonl")
    assert sorted((r.item_id, r.turn) for r in results) == [("a", 1), ("b", 3), ("c", 2), ("d", 1)]
    assert summary["targets"]["t"]["n_judged"] == 4


def test_sharding_is_deterministic_and_complete():
    from diagsafe_local.runs.manifest import Shard, shard_of

    ids = [f"item-{k}" for k in range(200)]
    parts = [[i for i in ids if Shard(index=s, count=4).owns(i)] for s in range(4)]
    assert sorted(sum(parts, [])) == sorted(ids) and all(parts)
    assert [shard_of(i, 4) for i in ids] == [shard_of(i, 4) for i in ids]
    assert shard_of("item-7", 4) == 1  # a fixed hash, stable across machines and Python processes
    with pytest.raises(Exception, match="0 <= i < N"):
        Shard.parse("4/4")
