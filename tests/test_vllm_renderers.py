"""What vLLM's renderers do with a chat, and what a run keys, refuses and checks by it (a GPU desk-check against
vLLM 0.32's source):
- tokenizer_mode mistral renders with mistral_common, hf with the Jinja template (tokenizers/registry.py,
  resolve_tokenizer_args): different token ids, so the key a verdict is reused by tells them apart (a resume
  with another mode is already another run id: the key holds where the run id would not);
- mistral mode ignores a configured chat_template and every template argument but reasoning_effort
  (tokenizers/mistral.py MistralTokenizer.apply_chat_template, renderers/mistral.py MistralRenderer): refused;
- hf mode drops a template argument the template does not read (renderers/hf.py resolve_chat_template_kwargs):
  a judge's arguments are checked against its template when its engine loads."""

from __future__ import annotations

import json

import pytest
from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines.template_arguments import check_template_arguments
from diagsafe_local.judging import JUDGES
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.selftest.tiny_models import GUARD_FORMATS

# -- 1. the reuse key tells tokenizer modes apart ---------------------------------------------------------------


def test_a_judge_without_a_tokenizer_mode_keeps_a_key_that_does_not_mention_one(tmp_path):
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run

    items = write_items(tmp_path / "items.jsonl", 1)
    keys = {}
    for mode in (None, "hf", "mistral"):
        judge = {"model": "j"} | ({"tokenizer_mode": mode} if mode else {})
        config = json.loads(config_file(tmp_path, items, name=f"run-{mode}", judge=judge).read_text())
        run = Run(RunConfig.model_validate(config))
        run.prepare()
        keys[mode] = json.dumps(run.ctx.judge_settings("harmjudge"), sort_keys=True)
        run.dir.close()
    assert "tokenizer_mode" not in keys[None]
    assert len(set(keys.values())) == 3


# -- 2. mistral mode renders without the template: its template settings are refused ---------------------------


def test_mistral_mode_refuses_a_chat_template_for_judge_and_target(tmp_path, monkeypatch):
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 1)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    shieldstral = {"model": "j", "rubric": "shieldstral", "chat_template": str(template)}  # mistral by default
    target = {"model": "t", "name": "t", "tokenizer_mode": "mistral", "chat_template": str(template)}
    for extra in ({"judge": shieldstral}, {"target": target}):
        result = cli("run", config_file(tmp_path, items, **extra))
        assert result.exit_code == 2 and "chat_template" in result.text and "mistral" in result.text, result.text
        assert "Traceback" not in result.output
    hf = {**shieldstral, "tokenizer_mode": "hf"}  # the template is rendered in hf mode
    assert JudgeConfig.model_validate(hf).chat_template == str(template)


def test_mistral_mode_refuses_a_judge_whose_template_arguments_it_would_ignore(tmp_path, monkeypatch):
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 1)
    for rubric in ("singguard", "nemotron-3.5-content-safety"):
        judge = {"model": "j", "rubric": rubric, "tokenizer_mode": "mistral"}
        result = cli("run", config_file(tmp_path, items, judge=judge))
        first = next(iter(JUDGES.get(rubric).chat_template_kwargs))[0]
        assert result.exit_code == 2 and "chat_template_kwargs" in result.text and first in result.text, result.text
    assert JudgeConfig(model="j", rubric="singguard", tokenizer_mode="hf").tokenizer_mode == "hf"


# -- 3. hf mode drops an argument its template does not read: checked when the engine loads ---------------------


def test_a_judges_template_arguments_are_the_ones_its_requests_send():
    assert JudgeConfig(model="j", rubric="singguard").template_arguments() == {
        "thinking_type": "singguard",
        "policy": "singguard",
    }
    nemotron = JudgeConfig(model="j", rubric="nemotron-3.5-content-safety")
    assert set(nemotron.template_arguments()) == {"enable_thinking", "request_categories"}
    assert JudgeConfig(model="j").template_arguments() == {}
    assert JudgeConfig(model="j", rubric="shieldstral").template_arguments() == {}


def test_an_argument_the_template_does_not_read_is_refused_naming_it_and_the_template():
    singguard = JudgeConfig(model="j", rubric="singguard").template_arguments()
    without_policy = "{{ thinking_type }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(RunFailed, match=r"'policy'.*the template t\.jinja"):
        check_template_arguments(without_policy, singguard, "the template t.jinja")
    check_template_arguments("{% if policy %}{{ policy }}{% endif %}" + without_policy, singguard, "t")
    with pytest.raises(RunFailed, match="does not parse"):
        check_template_arguments("{% for m in messages %}", singguard, "t")
    check_template_arguments("{% for m in messages %}", {}, "t")  # nothing to reach it: vLLM says at the request


@pytest.mark.parametrize("fmt", ["singguard", "nemotron-3.5"])
def test_each_tiny_guard_template_reads_its_judges_arguments(fmt):
    """The tiny models the real-engine runs load (test_guards_2026) read their guard's arguments, as the released
    templates do: the load check passes on them."""
    judge = {"singguard": "singguard", "nemotron-3.5": "nemotron-3.5-content-safety"}[fmt]
    arguments = JudgeConfig(model="j", rubric=judge, reasoning=judge != "singguard").template_arguments()
    check_template_arguments(GUARD_FORMATS[fmt][1].template, arguments, fmt)
