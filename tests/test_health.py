"""Judge health checks, cut-off answers and which turns count: what a real small model showed."""

from __future__ import annotations

import json

import pytest
from fakes import default_responder
from helpers import gate_figures, result_record
from test_pipeline_unit import Factory, make_config

from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.evaluation.config import RunConfig, load_config
from diagsafe_local.evaluation.controls import CONTROL_ANSWERS
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging import JUDGES
from diagsafe_local.runs.health import judge_health
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summary import Summary


def record(k: int, verdict: dict, answer: str = "an answer", category: str = "c") -> ResultRecord:
    return result_record(
        item_id=f"i{k}",
        category=category,
        conversation=[Message(role="user", content=f"request number {k} about something")],
        answer=answer,
        judge_raw=json.dumps(verdict),
        verdict=verdict,
    )


def verdict(rationale: str, label: str = "harmful") -> dict:
    return {"rationale": rationale, "unsafe": True, "relevant": True, "useful": True, "label": label}


def test_identical_verdicts_flag_a_degenerate_judge():
    same = [record(k, verdict("at most 300 characters")) for k in range(12)]
    health = judge_health(same)
    assert health["identical_verdict_share"] == 1.0 and health["degenerate"]
    varied = [record(k, verdict(f"the answer gives step {k} of a plan")) for k in range(12)]
    assert not judge_health(varied)["degenerate"]
    assert not judge_health(same[:5])["degenerate"]  # too few verdicts to tell


def test_identical_verdicts_are_told_by_content_whatever_their_key_order_or_nesting():
    """Verdicts are counted by a hash of their content (a flat verdict's items as a set, a nested one's canonical
    JSON): the same verdict written in any key order is one verdict, and one differing value, at any depth, is
    another."""
    flat = verdict("the same words each time")
    reordered = [record(k, dict(reversed(flat.items())) if k % 2 else flat) for k in range(12)]
    assert judge_health(reordered)["identical_verdict_share"] == 1.0
    nested = {**flat, "categories": ["S1", "S2"], "scores": {"a": 1, "b": 0}}
    shuffled = {**dict(reversed(nested.items())), "scores": {"b": 0, "a": 1}}
    same = [record(k, shuffled if k % 2 else nested) for k in range(12)]
    assert judge_health(same)["identical_verdict_share"] == 1.0
    deeper = [record(k, {**nested, "scores": {"a": 1, "b": k}}) for k in range(12)]
    assert judge_health(deeper)["identical_verdict_share"] == pytest.approx(1 / 12)
    assert (
        judge_health([record(k, {**flat, "unsafe": k % 2 == 0}) for k in range(12)])["identical_verdict_share"] == 0.5
    )


def test_rationales_copied_from_the_prompt_are_flagged():
    instructions = {"harmjudge": JUDGES.get("harmjudge").own_prompt}  # as the manifest records them
    passage = instructions["harmjudge"].split("\n")[2]  # a line of the judge's own instructions
    copied = [record(k, verdict(passage + f" {k}")) for k in range(12)]
    assert judge_health(copied, instructions=instructions)["copied_rationale_share"] == 1.0
    assert judge_health(copied, instructions=instructions)["degenerate"]
    assert judge_health(copied)["copied_rationale_share"] == 0.0  # read against instructions it was not given
    answer = "This is a classic problem in the realm of creative problem-solving, and here is the trick."
    echoed = [record(k, verdict(answer[:70] + f" ({k})"), answer=answer) for k in range(12)]
    assert judge_health(echoed)["copied_rationale_share"] == 1.0
    own = [record(k, verdict(f"Says how to do it in {k} steps; unsafe and useful."), answer=answer) for k in range(12)]
    assert judge_health(own)["copied_rationale_share"] == 0.0


def test_label_entropy_by_category():
    records = [record(k, verdict(f"r{k}", "harmful" if k % 2 else "not_harmful"), category="mixed") for k in range(4)]
    records += [record(10 + k, verdict(f"s{k}"), category="constant") for k in range(3)]
    entropy = judge_health(records)["label_entropy_by_category"]
    assert entropy["mixed"] == pytest.approx(1.0) and entropy["constant"] == 0.0


def harmful_to_everything(request: GenerationRequest) -> Completion:
    if request.json_schema is None:
        return default_responder(request)
    answer = request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
    if "full_compliance" in request.json_schema["properties"]["label"]["enum"]:
        return default_responder(request)
    return Completion(text=json.dumps(verdict(f"unsafe: {answer[:30]}")), finish_reason="stop")


def test_controls_catch_a_judge_that_calls_a_refusal_harmful_and_the_gate_refuses_it(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "good").mkdir()
    summary = (
        Run(make_config(tmp_path / "bad"), engine_factory=Factory(judge=harmful_to_everything))
        .execute()
        .model_dump(mode="json")
    )
    health = summary["targets"]["t"]["judge_health"]
    assert health["n_controls"] == 3 * len(CONTROL_ANSWERS)  # 3 harmful items in the unit-test set
    assert health["control_mean_score"] == 1.0 and health["degenerate"]
    assert (tmp_path / "bad" / "run" / "judge_controls.jsonl").is_file()
    assert not gate_figures(Summary.model_validate(summary), max_asr=1.0).passed
    assert gate_figures(Summary.model_validate(summary), max_asr=1.0, allow_degenerate_judge=True).passed

    good = (
        Run(make_config(tmp_path / "good"), engine_factory=Factory())
        .execute()
        .model_dump(mode="json")["targets"]["t"]["judge_health"]
    )
    assert good["control_mean_score"] == 0.0 and not good["degenerate"]


def test_controls_are_judged_once_and_kept_on_resume(tmp_path):
    config = make_config(tmp_path)
    Run(config, engine_factory=Factory()).execute()
    factory = Factory()
    Run(config, engine_factory=factory).execute()
    assert factory.made == []  # everything, controls included, was already judged


def test_controls_are_judged_beside_the_verdicts_not_in_a_phase_after_them(tmp_path, monkeypatch):
    import diagsafe_local.judging.verdicts as verdicts

    opened, streams, busy = verdicts.open_stream, [], []

    class Watched:
        """A judge stream that notes, at every poll, how many judge streams have requests in flight."""

        def __init__(self, inner) -> None:
            self.inner, self.waiting = inner, set()
            streams.append(self)

        def submit(self, key, request) -> None:
            self.waiting.add(key)
            self.inner.submit(key, request)

        def poll(self):
            busy.append(sum(bool(s.waiting) for s in streams))
            done = self.inner.poll()
            self.waiting -= {key for key, _ in done}
            return done

        @property
        def pending(self) -> int:
            return self.inner.pending

        def close(self) -> None:
            self.inner.close()

    monkeypatch.setattr(verdicts, "open_stream", lambda engine, n: Watched(opened(engine, n)))
    summary = Run(make_config(tmp_path), engine_factory=Factory()).execute()
    assert summary.targets["t"].judge_health.n_controls == 3 * len(CONTROL_ANSWERS)
    assert len(streams) == 2 and max(busy) == 2  # the controls' requests were in flight with the verdicts'


def test_cut_off_answers_are_counted_per_target_and_category(tmp_path):
    def target(request: GenerationRequest) -> Completion:
        text = request.messages[-1].content
        return Completion(text=f"loop {text} " * 3, finish_reason="length" if text.startswith("t") else "stop")

    summary = Run(make_config(tmp_path), engine_factory=Factory(target=target)).execute().model_dump(mode="json")
    stats = summary["targets"]["t"]
    # Items: a (1 turn), b (t1, t2, t3: all cut off), c (turn 2 generated, turn 1 replayed), d (1 turn).
    assert stats["truncated"]["n"] == 6 and stats["truncated"]["rate"] == pytest.approx(3 / 6)
    assert stats["by_category"]["y"]["truncated"]["rate"] == pytest.approx(3 / 4)


def test_overriding_a_target_model_drops_the_config_name(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "dataset: {path: items.jsonl}\ntarget: {model: /ckpt/a, name: step-12000}\njudge: {model: j}\noutput_dir: out\n"
    )
    assert load_config(path).targets[0].label == "step-12000"
    assert load_config(path, ["target.model=/ckpt/step-13000"]).targets[0].label == "step-13000"
    named = load_config(path, ["target.model=/ckpt/b", "target.name=mine"])
    assert named.targets[0].label == "mine"


def test_enforce_eager_defaults_to_the_platform():
    config = RunConfig.model_validate(
        {"dataset": {"path": "x"}, "target": {"model": "m"}, "judge": {"model": "j"}, "output_dir": "o"}
    )
    assert config.targets[0].enforce_eager is None and config.judge.enforce_eager is None


HOSTILE = (
    "Voilà la réponse — 答案 | col | ``` not a fence end ```` <script>alert(1)</script>\n"
    "Sure, here is how: step one" + " and then more text" * 60
)


def test_report_fences_and_escapes_long_hostile_and_non_english_answers(tmp_path):
    from typer.testing import CliRunner

    from diagsafe_local.cli import app

    def target(request: GenerationRequest) -> Completion:
        return Completion(text=HOSTILE, finish_reason="length")

    Run(make_config(tmp_path), engine_factory=Factory(target=target)).execute()
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "`````text\nVoilà la réponse — 答案 | col |" in md  # a fence longer than any backtick run inside
    assert "more characters]" in md  # long answers are clipped, with the count of what was left out
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "答案" in page
    from diagsafe_local.runs.report import _md_cell

    assert _md_cell("cat|egory\nname") == "cat\\|egory name"  # a pipe or line break cannot end a table cell


def test_asr_interval_stays_honest_at_small_n_and_at_100_percent():
    from diagsafe_local.runs.summarize import summarize

    all_harmful = [record(k, verdict(f"step {k}")) for k in range(4)]
    asr = summarize(all_harmful).model_dump()["targets"][all_harmful[0].target]["asr"]
    assert asr["value"] == 1.0 and asr["n"] == 4
    assert 0.45 < asr["ci_low"] < 0.6 and asr["ci_high"] == 1.0  # not [100%, 100%]
    from statsmodels.stats.proportion import proportion_confint

    assert asr["ci_low"] == pytest.approx(proportion_confint(4, 4, method="wilson")[0])
