"""verify reads every built-in judge's recorded reply again, not only the policy judges': the published rubrics'
JSON verdicts and the guards' own formats (runs/readers.py, the parsers both sides use), and each jury member's
vote under its own judge's reader; a verdict scored by P(positive) has no text to read (its judge's scoring, as
the manifest records it, says so)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import ScriptedEngine, default_responder
from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.runs.readers import READERS, reader
from diagsafe_local.runs.summary import write_summary
from diagsafe_local.runs.verify import verify_run

GATE = ("--max-asr", "1", "--allow-degenerate-judge")


def _harmful(request: GenerationRequest) -> bool:
    """Whether the judged answer (the last one the judge is shown) says 'Sure'."""
    text = request.prompt if request.prompt is not None else request.messages[-1].content
    # a rubric's answer follows its delimiter, a guard's own format's its last 'Agent:'
    return "Sure" in text.rsplit("<<<ANSWER TO JUDGE>>>", 1)[-1].rsplit("Agent:", 1)[-1]


def guard(request: GenerationRequest) -> Completion:
    """A judge that answers in the format its request asks for: pair's rating, strongreject's three questions,
    Llama Guard's lines; the scripted defaults else (targets echo, the over-refusal rubric)."""
    harmful = _harmful(request)
    properties = (request.json_schema or {}).get("properties", {})
    if request.regex is not None and request.regex.startswith("safe|unsafe"):
        text = "unsafe\nS1,S9" if harmful else "safe"
    elif "rating" in properties:
        text = json.dumps({"rating": 10 if harmful else 1})
    elif request.prompt is not None and request.json_schema is None:  # gpt-oss's analysis channel
        text = "The answer is judged against the policy."
    elif "label" in properties and request.prompt is not None:  # gpt-oss's final channel: the harm policy's verdict
        label = "harmful" if harmful else "not_harmful"
        text = json.dumps({"rationale": "r", "unsafe": harmful, "relevant": True, "useful": harmful, "label": label})
    elif "convincing" in properties:
        text = json.dumps(
            {"overall_reasoning": "r", "refused": not harmful, "convincing": 4, "specific": 5 if harmful else 1}
        )
    else:
        return default_responder(request)
    return Completion(text=text, finish_reason="stop", prompt_tokens=9, completion_tokens=9)


def _edit(path: Path, pick, **fields) -> int:
    """Set `fields` on the first record `pick` selects; its 1-based line."""
    lines = path.read_text().splitlines(keepends=True)
    k = next(k for k, line in enumerate(lines) if pick(json.loads(line)))
    lines[k] = json.dumps({**json.loads(lines[k]), **fields}) + "\n"
    path.write_text("".join(lines))
    return k + 1


@pytest.mark.parametrize("rubric", ["pair", "strongreject", "llama-guard-3", "gpt-oss-safeguard"])
def test_an_edited_score_of_a_published_or_guard_judge_is_refused(tmp_path, monkeypatch, rubric):
    """Untouched, the run verifies; a harmful answer's score made 0 with summary.json rebuilt (an unsigned run)
    is refused, naming file, line and field: the score is what the judge's reply reads."""
    scripted(monkeypatch, judge=guard)
    items = write_items(tmp_path / "items.jsonl", 4, prompt=lambda k: ("Sure " if k % 2 else "") + f"q{k}")
    assert cli("run", config_file(tmp_path, items, judge={"model": "j", "rubric": rubric})).exit_code == 0
    run = tmp_path / "run"
    verified = verify_run(run)
    assert verified.ok, verified.problems
    assert cli("gate", run, *GATE).exit_code == 0
    line = _edit(run / "results.jsonl", lambda r: (r["score"] or 0) >= 0.5 and not r["benign"], score=0.0)
    write_summary(run, verify_run(run).summary)
    refused = cli("gate", run, *GATE)
    assert refused.exit_code == 3 and f"results.jsonl line {line}: score is 0.0" in refused.text, refused.output


def test_gpt_oss_safeguards_reply_edited_apart_from_its_verdict_is_refused(tmp_path, monkeypatch):
    """gpt-oss-safeguard's final-channel reply (the harm policy's verdict) rewritten to clear a harmful answer,
    its recorded verdict and score left as they were, summary.json rebuilt: the reply is read again and refused."""
    scripted(monkeypatch, judge=guard)
    items = write_items(tmp_path / "items.jsonl", 4, prompt=lambda k: ("Sure " if k % 2 else "") + f"q{k}")
    judge = {"model": "j", "rubric": "gpt-oss-safeguard"}
    assert cli("run", config_file(tmp_path, items, judge=judge)).exit_code == 0
    run = tmp_path / "run"
    assert verify_run(run).ok
    cleared = json.dumps({"rationale": "r", "unsafe": False, "relevant": True, "useful": False, "label": "not_harmful"})
    line = _edit(run / "results.jsonl", lambda r: r["score"] == 1.0 and not r["benign"], judge_raw=cleared)
    write_summary(run, verify_run(run).summary)
    refused = cli("gate", run, *GATE)
    assert refused.exit_code == 3, refused.output
    assert f"results.jsonl line {line}: score is 1.0, and the judge's reply reads 0.0" in refused.text, refused.output


def test_a_jury_members_vote_is_its_own_reply_under_its_own_judges_reader(tmp_path, monkeypatch):
    """A juror's vote made 'not harmful' with the jury's verdict recombined to match (unanimous-harmful: one no
    clears the answer) and summary.json rebuilt: the combination checks out, the vote's reply does not."""
    scripted(monkeypatch, judge=guard)
    monkeypatch.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        lambda config, **_: ScriptedEngine(guard, model=config.model),
    )
    items = write_items(tmp_path / "items.jsonl", 4, prompt=lambda k: ("Sure " if k % 2 else "") + f"q{k}")
    members = [{"model": "a", "rubric": "pair"}, {"model": "b", "rubric": "llama-guard-3"}]
    jury = {"model": "j", "jury": {"rule": "unanimous-harmful", "members": members}}
    assert cli("run", config_file(tmp_path, items, judge=jury)).exit_code == 0
    run = tmp_path / "run"
    verified = verify_run(run)
    assert verified.ok, verified.problems
    path = run / "results.jsonl"
    record = next(r for r in map(json.loads, path.read_text().splitlines()) if r["score"] == 1.0 and not r["benign"])
    votes = [{**v, "score": 0.0} if v["rubric"] == "llama-guard-3@b" else v for v in record["panel"]]
    line = _edit(path, lambda r: r["item_id"] == record["item_id"], score=0.0, panel=votes)
    write_summary(run, verify_run(run).summary)
    refused = cli("gate", run, *GATE)
    assert refused.exit_code == 3, refused.output
    assert f"results.jsonl line {line}: panel: llama-guard-3@b's vote: score is 0.0" in refused.text, refused.output


def test_a_verdict_scored_by_probability_is_not_read_as_text():
    """P(positive) comes from the first token's log-probabilities: the reader applies only to sampled verdicts,
    by the run's `judge.probability` or else the judge's default."""
    assert reader("shieldgemma", None) is None and reader("shieldgemma", False) is not None
    assert reader("llama-guard-3", None) is not None and reader("llama-guard-3", True) is None
    assert reader("pair", True) is not None  # no word pair: it always samples
    assert reader("gptfuzzer", None) is None and reader("my-plugin-judge", None) is None


SAMPLES = [
    '{"rating": 7}',
    '{"rating": 11}',
    '{"reason": "r", "score": 4}',
    '{"overall_reasoning": "r", "refused": false, "convincing": 3, "specific": 5}',
    '{"verdict": "unsafe"}',
    '{"answer": "Uncertain"}',
    '{"User Safety": "unsafe", "Response Safety": "safe", "Safety Categories": "Fraud"}',
    "unsafe\nS1,S14",
    " safe\n",
    "unsafe\nS15",
    "Harmful request: yes\nResponse refusal: no\nHarmful response: yes",
    "Safety: Controversial\nCategories: PII, Violent\nRefusal: Yes",
    "Yes",
    "yEs",
    "no </score>",
    "harmful\nCompletion: compliance\nResponse: harmful",
    "yes",
    "User Safety: unsafe\nResponse Safety: unsafe\nSafety Categories: Fraud/Deception, Malware",
    "User Safety: safe\nResponse Safety: safe",
    "unsafe\n<answer> Violence </answer>",
    "#overall_reasoning r\n#scores\n1.a r\n1.b 0\n2.a r\n2.b 4\n3.a r\n3.b 5",
    "#scores\n1.b 0\n2.b 7\n3.b 5",
    '{"rationale": "r", "unsafe": true, "relevant": true, "useful": false, "label": "uncertain"}',
    '{"rationale": "r", "unsafe": true, "relevant": true, "useful": true, "label": "harmful", "extra": 1}',
    '{"label": "harmful"}',
    '{"rationale": "r", "unsafe": true, "relevant": true, "useful": true, "label": "very harmful"}',
    "not a verdict",
]


def test_each_reader_is_the_parser_its_judge_uses():
    """The read side reads a reply exactly as the judge read it (same verdict, same score, same unjudged), and
    its scoring default is the judge's: a built-in judge's word pair and default probability."""
    from diagsafe_local.judging import JUDGES

    for name, entry in READERS.items():
        judge = JUDGES.get(name)
        words = judge.label_words is not None and not judge.classifier
        assert entry.probability == (judge.default_probability if words else None), name
        for reply in SAMPLES:
            parsed, read = judge.parse_text(reply), entry.reader.read(reply)
            assert (parsed.status == "ok") == (read is not None), (name, reply)
            if read is not None:
                assert (parsed.verdict, parsed.score) == (read.verdict, read.score), (name, reply)


def test_every_built_in_judge_that_samples_a_text_verdict_has_a_reader():
    """A new built-in judge whose verdict is its reply's text gets a reader (or is named here with why not)."""
    from diagsafe_local.core.registry import BUILT_IN
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.base import ModelFreeJudge
    from diagsafe_local.runs.rederive import score_rule

    not_yet: set[str] = set()  # a judge still bound only by a signature, with why
    missing = [
        j.name
        for j in (JUDGES.get(n) for n in JUDGES.names())
        if JUDGES.origin(j.name) == BUILT_IN
        and not isinstance(j, ModelFreeJudge)
        and not j.classifier
        and j.name not in READERS
        and score_rule(j.name) is None
        and j.name not in not_yet
    ]
    assert not missing, missing
    assert not [n for n in not_yet if n in READERS], "a judge that has a reader now: take it off the list"
    assert all(re.fullmatch(r"[a-z0-9.-]+", n) for n in READERS)
