"""The grammar canary's reply is hostile input like any judge reply: one nested past the recursion limit is a
failed canary, on the run's side and on verify's, never a crash."""

from __future__ import annotations

from fakes import ScriptedEngine, default_responder
from test_adversarial import cli, config_file, write_items

from diagsafe_local.engines.base import Completion
from diagsafe_local.judging.canary import CANARY_SCHEMA
from diagsafe_local.runs.grammar import canary_held

DEEP = "[" * 3000


class DeepCanary(ScriptedEngine):
    def _answer(self, request):
        if request.json_schema == CANARY_SCHEMA:
            return Completion(text=DEEP, finish_reason="stop")
        return super()._answer(request)


def test_the_grammar_canary_reply_nested_deeply_is_a_failed_canary_not_a_crash(tmp_path, monkeypatch):
    assert canary_held(DEEP) is False
    monkeypatch.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        lambda config, **_: DeepCanary(default_responder, model=config.model),
    )
    ran = cli("run", config_file(tmp_path, write_items(tmp_path / "items.jsonl", 3)))
    assert ran.exit_code == 0 and "RecursionError" not in ran.output, ran.output
    gated = cli("gate", tmp_path / "run", "--max-asr", "1", "--allow-degenerate-judge")  # verify reads it again
    assert gated.exit_code == 3 and "the grammar canary came back '[[[" in gated.output, gated.output
