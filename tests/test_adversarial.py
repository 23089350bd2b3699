"""Hostile and faulty input, as an adversary would try it: configs, items, gold sets, tampered run directories,
a hostile HTTP server. Every case here once got through (a pass the gate should not give, a traceback, a hang,
lost data); each is kept so the next adversarial pass starts from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedEngine, default_responder
from servers import FakeOpenAIServer
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.engines.base import Completion


def cli(*args: str):
    """Run the CLI; the result with its output on one line (rich wraps long messages)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    result.text = " ".join(result.output.split())  # type: ignore[attr-defined]
    return result


def write_items(path: Path, n: int, prompt=lambda k: f"question {k}", **extra) -> Path:
    path.write_text("".join(json.dumps({"id": f"i{k}", "prompt": prompt(k), **extra}) + "\n" for k in range(n)))
    return path


def not_harmful(request):
    """Targets echo; the harm judge calls everything not harmful (a safe checkpoint)."""
    if request.json_schema is None:
        return default_responder(request)
    verdict = {"unsafe": False, "relevant": True, "useful": False, "label": "not_harmful", "rationale": "fine"}
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=9, completion_tokens=9)


def uncertain(request):
    if request.json_schema is None:
        return default_responder(request)
    verdict = {"unsafe": True, "relevant": True, "useful": False, "label": "uncertain", "rationale": "unsure"}
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=9, completion_tokens=9)


def config_file(tmp_path: Path, items: Path, name: str = "run", **extra) -> Path:
    data = {
        "dataset": {"path": str(items)},
        "target": {"model": "t", "name": "t"},
        "judge": {"model": "j"},
        "output_dir": str(tmp_path / name),
        **extra,
    }
    if "targets" in extra:  # a sweep
        del data["target"]
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def scripted(monkeypatch, judge=default_responder, target=default_responder) -> None:
    """`run` from the CLI with scripted engines: targets echo, the judge answers with `judge`."""
    responders = {"t": target, "j": judge}
    monkeypatch.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        lambda config, **_: ScriptedEngine(responders.get(config.model, default_responder), model=config.model),
    )


# -- 1. a safe checkpoint: intervals that contain their estimate ---------------------------------------------


def test_every_rate_at_0_of_n_and_n_of_n_has_an_interval_that_contains_it():
    from diagsafe_local.stats import wilson

    for n in range(1, 201):
        low, high = wilson(0, n)
        assert low == 0.0 and 0 < high <= 1, n
        low, high = wilson(n, n)
        assert high == 1.0 and 0 <= low < 1, n
        low, high = wilson(n / 2, n)
        assert low <= 0.5 <= high


def test_a_safe_checkpoint_runs_reports_and_gates(tmp_path, monkeypatch):
    scripted(monkeypatch, judge=not_harmful)
    config = config_file(tmp_path, write_items(tmp_path / "items.jsonl", 7))  # wilson(0, 7) was 2.8e-17
    result = cli("run", config)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    asr = summary["targets"]["t"]["asr"]
    assert asr["value"] == 0.0 and asr["ci_low"] == 0.0 and asr["ci_high"] > 0
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "figures").is_dir()
    assert cli("gate", tmp_path / "run", "--max-asr", "0.5", "--allow-degenerate-judge").exit_code == 0


# -- 4, 5. the corrected gate limits ASR itself; one definition of harmful ----------------------------------


def perfect_validation(tmp_path: Path) -> Path:
    """A validate directory for judge 'j' (harmjudge, sampled) with a perfect record on 20 + 20 gold items."""
    from diagsafe_local.engines.identity import engine_identity
    from diagsafe_local.judging.config import JudgeConfig

    identity = engine_identity(JudgeConfig(model="j"))
    out = tmp_path / "validation"
    out.mkdir()
    judge = {
        "judge": "harmjudge",
        "rubric": "harmjudge",
        "model": "j",
        "model_hash": identity.model_hash,
        "lora_hash": None,
        "scoring": "sampled",
        "tp": 20,
        "fp": 0,
        "tn": 20,
        "fn": 0,
    }
    (out / "validation.json").write_text(
        json.dumps({"gold": "gold.jsonl", "gold_sha256": "0" * 64, "task": "harm", "judges": [judge]})
    )
    return out


def test_corrected_gate_is_never_laxer_than_the_plain_one_for_uncertain_verdicts(tmp_path, monkeypatch):
    scripted(monkeypatch, judge=uncertain)
    validation = perfect_validation(tmp_path)
    config = config_file(
        tmp_path, write_items(tmp_path / "items.jsonl", 10), judge={"model": "j", "validation": str(validation)}
    )
    assert cli("run", config).exit_code == 0
    stats = json.loads((tmp_path / "run" / "summary.json").read_text())["targets"]["t"]
    assert stats["asr"]["value"] == 0.5 and stats["harmful_rate"]["rate"] == 0.0
    assert stats["corrected_asr"]["value"] == pytest.approx(0.5)  # was 0.0: "uncertain" dropped
    gate = ["gate", tmp_path / "run", "--max-asr", "0.2", "--allow-degenerate-judge"]
    plain, corrected = cli(*gate), cli(*gate, "--corrected")
    assert plain.exit_code == 1 and corrected.exit_code == 1, corrected.output
    assert "corrected ASR 0.500" in corrected.text


def test_a_score_of_exactly_one_half_is_uncertain_everywhere():
    from diagsafe_local.engines.base import Completion as C
    from diagsafe_local.judging.base import JUDGES
    from diagsafe_local.runs.verdicts import is_harmful, panel_score, score_class

    assert not is_harmful(0.5) and is_harmful(0.5000001)
    assert score_class(0.5) == "uncertain"
    assert panel_score([0.5, 0.5, 1.0], "majority") == 0.0 and panel_score([0.5], "any") == 0.0
    judge = JUDGES.get("harmclassifier")
    even = C(text="Yes", finish_reason="length", label_logprobs={"Yes": -0.6931, "No": -0.6931})
    outcome = judge.parse(even, probability=True)
    assert outcome.score == pytest.approx(0.5) and outcome.verdict["label"] == "No"  # was "Yes" at p >= 0.5


# -- 6. the judge's view of hostile text is in the red-team test of test_judges.py ---------------------------

# -- 7. a hostile server cannot hold the run -----------------------------------------------------------------


def test_retry_after_and_backoff_are_capped_by_backoff_max(monkeypatch):
    import asyncio

    from diagsafe_local.core.messages import Message
    from diagsafe_local.engines.base import GenerationRequest
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.openai_engine import OpenAIEngine

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds, *args, **kwargs):
        waits.append(seconds)
        return await real_sleep(0, *args, **kwargs)

    monkeypatch.setattr("diagsafe_local.engines.openai_engine.asyncio.sleep", recorded)
    server = FakeOpenAIServer(script=[("status", 429, 100000)])  # "Retry-After: 100000"
    try:
        engine = OpenAIEngine(
            EngineConfig(kind="openai", model="m", base_url=server.base_url, max_retries=1, backoff_max=0.2)
        )
        [completion] = engine.generate(
            [GenerationRequest(messages=(Message(role="user", content="hi"),), max_tokens=5)]
        )
        assert completion.error is None and waits and max(waits) <= 0.2  # the server's 100000 s capped
        engine.close()
    finally:
        server.close()
    for field, value in (("backoff_max", ".inf"), ("backoff_base", ".inf"), ("timeout", ".nan")):
        with pytest.raises(Exception, match="finite number"):
            from diagsafe_local.core.settings import apply_override

            data = {"model": "m", "kind": "openai", "base_url": "http://x"}
            apply_override(data, f"{field}={value}")
            EngineConfig.model_validate(data)


def test_a_refused_request_without_a_key_variable_says_so_plainly(monkeypatch):
    from diagsafe_local.core.messages import Message
    from diagsafe_local.engines.base import GenerationRequest
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.openai_engine import FatalAPIError, OpenAIEngine

    server = FakeOpenAIServer(always=("status", 401))
    try:
        engine = OpenAIEngine(EngineConfig(kind="openai", model="m", base_url=server.base_url))
        with pytest.raises(FatalAPIError) as caught:
            engine.generate([GenerationRequest(messages=(Message(role="user", content="hi"),), max_tokens=5)])
        assert "$the" not in str(caught.value) and "set api_key_env" in str(caught.value)
        engine.close()
    finally:
        server.close()


# -- 8, 9, 17. hostile configs: bombs, encodings, bad values -------------------------------------------------

BILLION_LAUGHS = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    "text, message",
    [
        (BILLION_LAUGHS + "dataset: {path: x}\n", "expand to more than 100,000 values"),
        ("dataset: &d {path: x, extra: *d}\n", "refers to a node that contains it"),
        ("dataset: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 64 levels"),
    ],
)
@pytest.mark.timeout(120)  # expanding would not end: refused before, it ends at once
def test_configs_that_expand_without_bound_are_refused_quickly(tmp_path, text, message):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    result = cli("run", path)
    assert result.exit_code == 2 and message in result.text, result.output
    assert "Traceback" not in result.output


def test_hostile_config_values_are_input_errors(tmp_path):
    items = write_items(tmp_path / "items.jsonl", 2)
    cases = [
        ({"target": {"model": "t", "sampling": {"max_tokens": True}}}, "expected a number, got the boolean true"),
        ({"output_dir": ""}, "output_dir: Value error, must name a directory"),
        ({"output_dir": "  "}, "must name a directory"),
        ({"gate": {"max_asr_category": {"x": 5}}}, "max_asr_category.x"),
        ({"gate": {"max_asr_category": {"x": float("inf")}}}, "max_asr_category.x"),
        ({"dataset": {"path": str(tmp_path)}}, "a directory"),
    ]
    for extra, message in cases:
        path = tmp_path / "c.yaml"
        data = {"dataset": {"path": str(items)}, "target": {"model": "t"}, "judge": {"model": "j"}}
        data["output_dir"] = str(tmp_path / "out")
        data.update(extra)
        path.write_text(json.dumps(data).replace("Infinity", ".inf"))
        result = cli("run", path)
        assert result.exit_code == 2 and message in result.text, (extra, result.output)
        assert "Traceback" not in result.output
    path.write_bytes(b"dataset: {path: caf\xe9}\n")  # Latin-1, not UTF-8
    result = cli("run", path)
    assert result.exit_code == 2 and "c.yaml line 1: invalid UTF-8" in result.text
    result = cli("run", config_file(tmp_path, items), "--set", "output_dir=[unclosed")
    assert result.exit_code == 2 and "--set output_dir: the value is not valid YAML" in result.text
    assert cli("run", tmp_path).exit_code == 2  # a directory as the config


def test_yaml_merge_keys_work_and_the_mappings_own_keys_win(tmp_path):
    from diagsafe_local.evaluation.config import load_config

    items = write_items(tmp_path / "items.jsonl", 1)
    path = tmp_path / "merge.yaml"
    text = (
        f"dataset: {{path: {items}}}\n"
        "target: &engine {model: t, dtype: float32, max_model_len: 2048}\n"
        "judge: {<<: *engine, model: j}\n"
        f"output_dir: {tmp_path / 'out'}\n"
    )
    path.write_text(text)
    config = load_config(path)  # was "invalid YAML"
    assert config.judge.model == "j" and config.judge.dtype == "float32" and config.judge.max_model_len == 2048
    path.write_text(text.replace("model: j}", "model: j, model: k}"))
    with pytest.raises(Exception, match="given twice"):
        load_config(path)


# -- 2, 3. the gate verifies: whole runs only, its own results, figures recomputed, signatures --------------


def finished_run(
    tmp_path: Path, monkeypatch, n: int = 6, name: str = "run", responder=default_responder, **extra
) -> Path:
    """A finished run from the CLI: n items, half asking 'Sure' (judged harmful by the scripted judge)."""
    scripted(monkeypatch, judge=responder)
    items = write_items(tmp_path / f"{name}-items.jsonl", n, prompt=lambda k: ("Sure " if k % 2 else "") + f"q{k}")
    result = cli("run", config_file(tmp_path, items, name, **extra))
    assert result.exit_code == 0, result.output
    return tmp_path / name


GATE = ("--max-asr", "1", "--allow-degenerate-judge")


def test_the_gate_refuses_a_shard_an_empty_shard_and_a_merge_of_some_shards(tmp_path, monkeypatch):
    from diagsafe_local.runs.manifest import shard_of

    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 8)
    config = config_file(tmp_path, items)
    count = 3
    owners = {shard_of(f"i{k}", count) for k in range(8)}
    empty_count = next(c for c in range(9, 64) if len({shard_of(f"i{k}", c) for k in range(8)}) < c)
    empty = next(i for i in range(empty_count) if i not in {shard_of(f"i{k}", empty_count) for k in range(8)})
    assert cli("run", config, "--shard", f"{empty}/{empty_count}").exit_code == 0  # nothing to do is no failure
    empty_dir = tmp_path / "run" / "shards" / f"shard-{empty:04d}-of-{empty_count:04d}"
    refused = cli("gate", empty_dir, "--max-asr", "0")
    assert refused.exit_code == 3 and "8 of 8 judged answers are missing (this is shard" in refused.text, refused.text
    for index in sorted(owners):
        assert cli("run", config, "--shard", f"{index}/{count}").exit_code == 0
    shards = sorted((tmp_path / "run" / "shards").glob(f"shard-*-of-{count:04d}"))
    one = cli("gate", shards[0], *GATE)
    assert one.exit_code == 3 and "judged answers are missing" in one.text and "merge every shard" in one.text
    partial = cli("merge", *shards[:-1], "--out", tmp_path / "partial")
    assert partial.exit_code == 0, partial.output
    gated = cli("gate", tmp_path / "partial", *GATE)
    assert gated.exit_code == 3 and "judged answers are missing" in gated.text
    whole = cli("merge", *shards, "--out", tmp_path / "whole")
    assert whole.exit_code == 0 and cli("gate", tmp_path / "whole", *GATE).exit_code == 0


def _rewrite_summary(run_dir: Path, edit) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    edit(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_gate_recomputes_every_figure_from_the_results(tmp_path, monkeypatch):
    from diagsafe_local.core.cache import file_sha256

    run_dir = finished_run(tmp_path, monkeypatch)
    assert cli("gate", run_dir, "--max-asr", "0.6", "--allow-degenerate-judge").exit_code == 0
    assert cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge").exit_code == 1
    original = (run_dir / "summary.json").read_text()

    def lower(summary):
        summary["targets"]["t"]["asr"]["value"] = 0.0

    _rewrite_summary(run_dir, lower)  # the figure edited, the results hash left as it was
    edited = cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge")
    assert edited.exit_code == 3 and "targets.t.asr.value is 0.0 in summary.json, 0.5 recomputed" in edited.text
    (run_dir / "summary.json").write_text(original)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records:  # the results edited to safe, their hash recomputed in the summary
        record["score"] = 0.0
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _rewrite_summary(run_dir, lambda s: s.update(results_sha256=file_sha256(run_dir / "results.jsonl")))
    forged = cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge")
    assert forged.exit_code == 3 and "does not match the run's records" in forged.text
    report = cli("report", run_dir)  # the report says the same, as a banner, and still renders
    assert report.exit_code == 0 and "does not verify" in report.text
    assert "NOT VERIFIED" in (run_dir / "report.md").read_text()


def test_the_gate_refuses_another_runs_results_under_this_manifest(tmp_path, monkeypatch):
    mine = finished_run(tmp_path, monkeypatch, name="mine")
    theirs = finished_run(tmp_path, monkeypatch, name="theirs", responder=not_harmful)
    for name in ("results.jsonl", "summary.json"):
        (mine / name).write_bytes((theirs / name).read_bytes())
    result = cli("gate", mine, "--max-asr", "0.2", "--allow-degenerate-judge")
    assert result.exit_code == 3 and "holds results of another run" in result.text
    assert "summary.json is of run" in result.text


def test_a_signed_run_verifies_with_its_key_and_an_edited_one_does_not(tmp_path, monkeypatch):
    from diagsafe_local.core.jsonl import read_records
    from diagsafe_local.runs.records import ControlRecord, read_results
    from diagsafe_local.runs.summarize import summarize
    from diagsafe_local.runs.summary import read_summary, write_summary

    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", "k" * 32)
    run_dir = finished_run(tmp_path, monkeypatch)
    assert (run_dir / "signature.json").is_file()
    signed = cli("gate", run_dir, *GATE, "--require-signature")
    assert signed.exit_code == 0 and "signature: signature verified" in signed.text
    # rewrite every file consistently: results safe (the judge's replies too), summary recomputed, hash and all
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    safe = {"rationale": "fine", "unsafe": False, "relevant": True, "useful": False, "label": "not_harmful"}
    for record in records:
        record.update(score=0.0, verdict=safe, judge_raw=json.dumps(safe))
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    stored = read_summary(run_dir)
    controls = read_records(run_dir / "judge_controls.jsonl", ControlRecord)[0]
    summary = summarize(read_results(run_dir / "results.jsonl"), controls=controls)
    targets = {n: t.model_copy(update={"throughput": stored.targets[n].throughput}) for n, t in summary.targets.items()}
    write_summary(
        run_dir, summary.model_copy(update={"run_id": stored.run_id, "reused": stored.reused, "targets": targets})
    )
    monkeypatch.delenv("DIAGSAFE_SIGNING_KEY")
    unkeyed = cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge")
    assert unkeyed.exit_code == 0 and "signed, but not checked" in unkeyed.text  # what a hash alone cannot catch
    assert cli("gate", run_dir, *GATE, "--require-signature").exit_code == 2  # no key: a usage error
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", "k" * 32)
    caught = cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge")
    assert caught.exit_code == 3 and "changed since it was signed: results.jsonl, summary.json" in caught.text
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", "another key")
    other = cli("gate", run_dir, *GATE)
    assert other.exit_code == 3 and "does not verify with this key" in other.text
    (run_dir / "signature.json").unlink()
    unsigned = cli("gate", run_dir, *GATE, "--require-signature")
    assert unsigned.exit_code == 3 and "it was not signed" in unsigned.text


def test_a_run_that_judged_nothing_fails_and_its_health_says_no_verdicts(tmp_path, monkeypatch):
    def garbage(request):
        if request.json_schema is None:
            return default_responder(request)
        return Completion(text="not json", finish_reason="stop")

    scripted(monkeypatch, judge=garbage)
    config = config_file(tmp_path, write_items(tmp_path / "items.jsonl", 3), judge={"model": "j", "max_attempts": 1})
    result = cli("run", config)
    assert result.exit_code == 3 and "nothing of t could be judged" in result.text
    assert "no verdicts" in result.text  # the summary table's judge health column
    gate = cli("gate", tmp_path / "run", "--max-asr", "1", "--max-failure-rate", "1")
    assert gate.exit_code == 1 and "judge health: no verdicts" in gate.text


# -- 9, 11, 12, 13. hostile gold sets and item files ----------------------------------------------------------


def validate(tmp_path: Path, gold: Path, *extra: str):
    return cli("validate", "--gold", gold, "--format", "csv", "--out", tmp_path / "val", *extra)


@pytest.mark.slow
def test_hostile_gold_sets_are_errors_naming_file_line_and_column(tmp_path):
    gold = tmp_path / "gold.csv"
    good = "id,prompt,response,label,judge\n1,p,r,1,1\n2,p,r,0,0\n"
    assert validate(tmp_path, gold.write_text(good) and gold, "--stored", "judge").exit_code == 0
    cases = [
        ("id,prompt,response,label,judge\n1,p,r,1,1\n2,hello,extra,r,0,0\n", "gold.csv line 3: 6 fields, more than"),
        ("id,prompt,prompt,label,judge\n1,p,r,1,1\n", "gold.csv line 1: field 'prompt': the header names"),
        ("id,prompt,response,label,judge\n1,p,r,1,1\n2,p,r\n", "gold.csv line 3: field 'label': missing"),
        ('id,prompt,response,label,judge\n1,"p,r,1,1\n', "not valid CSV"),
        ("id,prompt,response,label,judge\n1,p,r,,1\n2,p,r,,0\n", "no item has a label"),
        (
            "id,prompt,response,label,judge\n1,p,r,1,1\n1,p,r,0,0\n",
            "gold.csv line 3: field 'id': id '1' repeats line 2",
        ),
    ]
    for text, message in cases:
        gold.write_text(text)
        result = validate(tmp_path, gold, "--stored", "judge", "--id-column", "id")
        assert result.exit_code == 2 and message in result.text, (text, result.output)
        assert "Traceback" not in result.output
    gold.write_text("id,prompt,response,a1,a2,judge\n1,p,r,1,0,1\n2,p,r,0,1,0\n")  # every vote tied
    tied = validate(tmp_path, gold, "--stored", "judge", "--label-column", "a1", "--label-column", "a2")
    assert tied.exit_code == 2 and "every annotators' vote is tied" in tied.text
    gold.write_text(good)
    assert "unknown encoding 'nope'" in validate(tmp_path, gold, "--stored", "judge", "--encoding", "nope").text
    directory = validate(tmp_path, tmp_path, "--stored", "judge")
    assert directory.exit_code == 2 and "a directory, not a data file" in directory.text


def test_published_formats_refuse_duplicate_ids_instead_of_merging_them(tmp_path):
    jbb = tmp_path / "jbb.csv"
    jbb.write_text(
        "Index,goal,prompt,target_response,human1,human2,human3,human_majority,harmbench_cf\n"
        "0,g,p,bad answer,1,1,1,1,1\n0,g,p,fine answer,0,0,0,0,0\n"
    )
    result = cli("validate", "--gold", jbb, "--format", "jbb", "--out", tmp_path / "v", "--stored", "harmbench_cf")
    assert result.exit_code == 2 and "jbb.csv line 3: field 'id': id '0' repeats line 2" in result.text


def test_label_words_of_the_other_task_are_refused(tmp_path):
    gold = tmp_path / "gold.csv"
    gold.write_text("prompt,response,label,judge\np,r,refusal,1\np,r,compliance,0\n")
    result = validate(tmp_path, gold, "--stored", "judge", "--task", "harm")
    assert result.exit_code == 2 and "label 'refusal' is a refusal-task word" in result.text
    assert validate(tmp_path, gold, "--stored", "judge", "--task", "refusal").exit_code == 0


def test_a_validation_with_negative_counts_is_refused(tmp_path, monkeypatch):
    validation = perfect_validation(tmp_path)
    data = json.loads((validation / "validation.json").read_text())
    data["judges"][0]["fp"] = -5
    (validation / "validation.json").write_text(json.dumps(data))
    scripted(monkeypatch)
    config = config_file(
        tmp_path, write_items(tmp_path / "items.jsonl", 2), judge={"model": "j", "validation": str(validation)}
    )
    result = cli("run", config)
    assert result.exit_code == 2 and "judges.0.fp" in result.text and not (tmp_path / "run").exists()


def test_hostile_item_files_are_input_errors_and_leave_no_run_behind(tmp_path, monkeypatch):
    scripted(monkeypatch)
    items = tmp_path / "items.jsonl"
    cases = [
        ('{"id": "a", "prompt": "hi \\ud800"}\n', "items.jsonl line 1: a string holds a lone surrogate"),
        ('{"id": "\\udfff", "prompt": "hi"}\n', "lone surrogate"),
        ('{"id": "a", "prompt": "hi", "meta": ' + "[" * 200_000 + "]" * 200_000 + "}\n", "nested too deeply"),
    ]
    for text, message in cases:
        items.write_text(text)
        result = cli("run", config_file(tmp_path, items))
        assert result.exit_code == 2 and message in result.text, result.output
        assert not (tmp_path / "run").exists()  # refused before the run directory (no manifest left 'running')
    csv_items = tmp_path / "items.csv"
    csv_items.write_text("id,prompt\na,hello,extra\n")
    result = cli("run", config_file(tmp_path, csv_items))
    assert result.exit_code == 2 and "items.csv line 2: 3 fields, more than the header's 2" in result.text


def test_a_null_in_a_parquet_string_column_is_missing_not_a_float(tmp_path, monkeypatch):
    import pandas as pd

    scripted(monkeypatch)
    path = tmp_path / "items.parquet"
    pd.DataFrame({"id": ["a", "b"], "prompt": ["hi", "there"], "category": ["x", None]}).to_parquet(path)
    assert cli("run", config_file(tmp_path, path)).exit_code == 0
    categories = {json.loads(line)["category"] for line in (tmp_path / "run" / "results.jsonl").open()}
    assert categories == {"x", ""}


# -- 10, 14, 15, 17. data loss and wrong figures ---------------------------------------------------------------


def test_a_users_config_in_the_output_directory_is_never_overwritten(tmp_path, monkeypatch):
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 2)
    (tmp_path / "run").mkdir()
    config = config_file(tmp_path, items)
    mine = tmp_path / "run" / "config.yaml"
    text = "# my comments\n" + config.read_text()
    mine.write_text(text)
    for extra in ([], ["--overwrite"]):
        result = cli("run", mine, "--set", "judge.max_attempts=2", *extra)
        assert result.exit_code == 2 and "was not written by diagsafe-local" in result.text
        assert mine.read_text() == text
    mine.unlink()
    assert cli("run", config).exit_code == 0
    assert cli("run", config).exit_code == 0  # its own resolved config, rewritten on resume
    assert mine.read_text().startswith("# written by diagsafe-local")


def test_an_edited_chat_template_file_is_a_new_model_for_resume(tmp_path, monkeypatch):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 2)
    config = config_file(tmp_path, items, target={"model": "t", "name": "t", "chat_template": str(template)})
    assert cli("run", config).exit_code == 0
    first = json.loads((tmp_path / "run" / "manifest.json").read_text())["targets"]["t"]["chat_template_hash"]
    assert cli("run", config).exit_code == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["reused"]["generations"] == 2
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    assert cli("run", config).exit_code == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["reused"]["generations"] == 0
    second = json.loads((tmp_path / "run" / "manifest.json").read_text())["targets"]["t"]["chat_template_hash"]
    assert first and second and first != second


def test_merge_refuses_runs_judged_by_different_judges_unless_asked(tmp_path, monkeypatch):
    a = finished_run(tmp_path, monkeypatch, name="a")
    b = finished_run(tmp_path, monkeypatch, name="b", target={"model": "t", "name": "u"}, judge={"model": "k"})
    refused = cli("merge", a, b, "--out", tmp_path / "m")
    assert (
        refused.exit_code == 2 and "judge model: j vs k" in refused.text and "--allow-different-judges" in refused.text
    )
    assert not (tmp_path / "m" / "results.jsonl").exists()
    assert cli("merge", a, b, "--out", tmp_path / "m", "--allow-different-judges").exit_code == 0
    c = finished_run(
        tmp_path, monkeypatch, name="c", judge={"model": "j", "max_attempts": 2}
    )  # same judge, same target
    same = cli("merge", a, c, "--out", tmp_path / "n")
    assert same.exit_code == 2 and "duplicate result" in same.text


def test_compare_says_kappa_is_undefined_for_two_single_class_runs(tmp_path, monkeypatch):
    a = finished_run(tmp_path, monkeypatch, name="a", responder=not_harmful)
    b = finished_run(
        tmp_path, monkeypatch, name="b", responder=not_harmful, target={"model": "t", "name": "t", "system_prompt": "x"}
    )
    result = cli("compare", a, b, "--allow-different-datasets", "--json")
    data = json.loads(result.output)["agreement"]
    assert data["cohen_kappa"] is None and data["cohen_kappa_note"].startswith("undefined")
    assert "Cohen's kappa undefined" in cli("compare", a, b, "--allow-different-datasets").text


SECOND_SIGNAL = """
import sys, time
import typer
from diagsafe_local.commands.common import user_errors

@user_errors
def main():
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # the work, until the first signal ends it
    finally:
        print("closing", flush=True)  # an engine closing, a lock being released
        sys.stdin.readline()  # still closing when the test has sent its next signal
        print("closed", flush=True)

try:
    main()
except typer.Exit as exc:
    print("exiting", flush=True)
    sys.stdin.readline()  # the interpreter's own shut-down, the third signal sent meanwhile
    sys.exit(exc.exit_code)
"""


def test_a_second_and_third_sigterm_neither_cut_the_clean_up_short_nor_change_the_exit_code(tmp_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", SECOND_SIGNAL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for wait_for in ("ready", "closing", "exiting"):  # a signal at each, the child held there until it is sent
        while (line := proc.stdout.readline().strip()) != wait_for:
            seen.append(line)
            assert line, seen
        seen.append(line)
        proc.send_signal(signal.SIGTERM)
        if wait_for != "ready":
            proc.stdin.write("go on\n")
            proc.stdin.flush()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (proc.returncode, err)
    assert "closed" in seen + out.split() and "interrupted by SIGTERM" in err


def test_a_full_disk_is_an_environment_failure_not_a_crash(tmp_path):
    import subprocess

    from helpers import SAMPLE

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        result = cli("bench", "--dataset", SAMPLE, "--metrics", "rouge1_recall", "--out", disk / "out")
        assert result.exit_code == 3 and "no space left on the device" in result.text, result.output
        assert not list((disk / "out").glob(".*.tmp"))  # no half-written file
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_summary_whose_reused_counts_lack_one_is_refused_naming_it_not_a_crash(tmp_path, monkeypatch):
    """summary.json's `reused` holds the answers and the verdicts reused: one without its answers' count is a file
    that does not read (exit 3, naming the field), not an unexpected KeyError in the report."""
    scripted(monkeypatch)
    config = config_file(tmp_path, write_items(tmp_path / "items.jsonl", 2))
    assert cli("run", config).exit_code == 0
    assert cli("run", config).exit_code == 0  # resumed: reused counts written
    path = tmp_path / "run" / "summary.json"
    summary = json.loads(path.read_text())
    del summary["reused"]["generations"]
    path.write_text(json.dumps(summary))
    result = cli("report", tmp_path / "run")
    assert result.exit_code == 3, result.text
    assert "reused.generations" in result.text and "KeyError" not in result.text
