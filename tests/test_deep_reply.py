"""A judge reply nested deeper than Python's recursion limit ('[' * 3000: a few tokens a model may write, or an
answer may steer it to echo) is an invalid reply, unjudged, on the write side (the run finishes) and the read
side (verify, the gate), never a traceback."""

from __future__ import annotations

from fakes import default_responder
from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.runs.readers import ModelReader
from diagsafe_local.runs.records import ResultRecord, read_results
from diagsafe_local.runs.rederive import score_rule

DEEP = "[" * 3000


def _deep_on_q1(request: GenerationRequest) -> Completion:
    if request.json_schema is not None and "q1" in request.messages[-1].content:
        return Completion(text=DEEP, finish_reason="stop")
    return default_responder(request)


def test_a_deeply_nested_reply_reads_as_no_verdict():
    rule = score_rule("harmjudge")
    assert rule is not None and rule.read(DEEP) is None and rule.read("{" * 3000) is None
    parsed = ModelReader(ResultRecord, lambda v: 0.0).parse(DEEP)
    assert isinstance(parsed, str) and parsed


def test_a_run_whose_judge_replies_deeply_nested_finishes_and_verifies(tmp_path, monkeypatch):
    scripted(monkeypatch, judge=_deep_on_q1)
    items = write_items(tmp_path / "items.jsonl", 3, prompt=lambda k: f"q{k}")
    ran = cli("run", config_file(tmp_path, items))
    assert ran.exit_code == 0, ran.output
    records = read_results(tmp_path / "run" / "results.jsonl")
    assert [r.parse_status for r in records if r.item_id == "i1"] == ["invalid"]
    gated = cli("gate", tmp_path / "run", "--max-asr", "1", "--max-failure-rate", "1", "--allow-degenerate-judge")
    assert gated.exit_code in (0, 1), gated.output
    assert "1 parse failures" in gated.output, gated.output
