"""Every judge that renders through an engine has its chat template arguments checked against that engine's
template when it loads (a template that does not read one would drop it silently: vLLM's
resolve_chat_template_kwargs, transformers' apply_chat_template alike): a jury member or a cascade's full judge
riding on the judge's engine, or on another member's, with its own arguments; and the transformers engine too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import ScriptedEngine

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines import create_engine
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging.config import JudgeConfig

pytestmark = pytest.mark.slow  # the tiny models are built (~11 s, shared with the real-engine tests)

READS_SINGGUARDS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if policy %}{{ policy }}{% endif %}{% if thinking_type %}{{ thinking_type }}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _judge(model: Path, **fields: Any) -> dict[str, Any]:
    return {"kind": "transformers", "model": str(model), "dtype": "float32", **fields}


class Engines:
    """The target and any scripted judge by script; every transformers engine real."""

    def __init__(self) -> None:
        self.scripted: list[ScriptedEngine] = []

    def __call__(self, config: Any, **options: Any) -> Any:
        if config.kind == "transformers":
            return create_engine(config, **options)
        self.scripted.append(ScriptedEngine(model=config.model))
        return self.scripted[-1]


def _run(tmp_path: Path, judge: dict[str, Any], **fields: Any) -> tuple[Run, Engines]:
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "h1", "prompt": "explain the exploit", "category": "cyber"}) + "\n")
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(items)},
            "target": {"model": "t", "name": "t", "sampling": {"max_tokens": 8}},
            "judge": {**judge, "sampling": {"max_tokens": 8}},
            "output_dir": str(tmp_path / "run"),
            **fields,
        }
    )
    engines = Engines()
    return Run(config, engine_factory=engines), engines


def test_the_transformers_engine_refuses_an_argument_its_template_does_not_read(tiny_models, tmp_path):
    with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument '(policy|thinking_type)'"):
        create_engine(JudgeConfig(**_judge(tiny_models["judge"], rubric="singguard")))
    template = tmp_path / "reads.jinja"
    template.write_text(READS_SINGGUARDS)
    create_engine(JudgeConfig(**_judge(tiny_models["judge"], rubric="singguard", chat_template=str(template)))).close()


def test_a_jury_member_on_the_judges_engine_is_checked_with_its_own_arguments(tiny_models, tmp_path):
    """The member is served as the judge is, so it rides on the judge's engine: refused when that engine loads,
    before anything is asked (colocated: the judge loads before the target generates)."""
    model = tiny_models["judge"]
    members = [_judge(model, name="plain"), _judge(model, rubric="singguard", name="guard")]
    run, engines = _run(tmp_path, {**_judge(model), "jury": {"members": members}}, placement={"mode": "colocate"})
    with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument"):
        run.execute()
    assert [e.calls for e in engines.scripted] in ([], [0])


def test_a_jury_member_on_another_members_engine_is_checked_with_its_own_arguments(tiny_models, tmp_path):
    model = tiny_models["judge"]
    members = [_judge(model, name="plain"), _judge(model, rubric="singguard", name="guard")]
    run, _ = _run(tmp_path, {"model": "j", "jury": {"members": members}})
    with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument"):
        run.execute()


def test_a_cascades_full_judge_on_the_screens_engine_is_checked_with_its_own_arguments(tiny_models, tmp_path):
    model = tiny_models["judge"]
    cascade = {"judge": _judge(model, rubric="singguard"), "band": [0.0, 1.0]}
    run, engines = _run(tmp_path, {**_judge(model), "cascade": cascade}, placement={"mode": "colocate"})
    with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument"):
        run.execute()
    assert [e.calls for e in engines.scripted] in ([], [0])


def test_the_vllm_engine_checks_the_arguments_it_is_given_for_its_riders(tiny_models):
    """The real vLLM engine (its own start, ~45 s): the arguments the run gives it (a rider's) are checked against
    the template vLLM resolves, not its config's own (none here)."""
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    config = JudgeConfig(model=str(tiny_models["judge"]), max_model_len=256)
    with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument 'policy'"):
        VLLMEngine(config, template_arguments={"policy": "singguard"})
