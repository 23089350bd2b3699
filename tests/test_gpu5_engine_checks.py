"""The engines' load-time checks against what vLLM 0.32 and transformers actually do (the GPU desk check's
findings): a Mistral-format tokenizer under transformers, named chat templates, the renderer vLLM picks by
architecture, mistral_common's reasoning_effort by tokenizer version, and `load_format: npcache`.

vllm.LLM is replaced by a stand-in holding the model's real tokenizer and a renderer of vLLM's own class (never
started: no engine, no lock); what is checked is vLLM's and transformers' own code on those objects."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_guards_2026 import write_tiny_tekken
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.fingerprint import model_fingerprint
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.judging.config import JudgeConfig

NAMED_TOOL_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}{{ policy }}"


def _tekken_model(folder: Path, version: str = "v13") -> Path:
    """A model folder holding only Mistral's tokenizer file (tekken.json of `version`) and a config."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_tiny_tekken(folder, 1200)
    tekken = json.loads(path.read_text())
    tekken["config"]["version"] = version
    if version == "v15":  # from v15 a tokenizer declares the reasoning efforts it takes
        effort = {"type": "enum", "accepts_none": True, "default": "none", "values": ["none", "high"]}
        tekken["model_settings_builder"] = {"reasoning_effort": effort}
    path.write_text(json.dumps(tekken))
    (folder / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    return folder


def _stand_in(tokenizer: Any, renderer: str, mode: str = "auto") -> type:
    """vllm.LLM's stand-in: `tokenizer` as get_tokenizer() gives it, `llm.renderer` of vLLM's class `renderer`
    (module:Class under vllm.renderers, uninitialised), and an engine core whose shutdown is recorded."""
    import importlib

    module, name = renderer.split(":")
    cls = getattr(importlib.import_module(f"vllm.renderers.{module}"), name)

    class StandIn:
        shutdowns: list[str] = []

        def __init__(self, **kwargs: Any) -> None:
            model = kwargs["model"]
            self.model_config = SimpleNamespace(
                tokenizer_mode=mode,
                max_model_len=256,
                model=model,
                tokenizer=model,
                tokenizer_revision=None,
                code_revision=None,
                trust_remote_code=False,
                hf_config=SimpleNamespace(model_type="qwen2"),
            )
            core = SimpleNamespace(shutdown=lambda: StandIn.shutdowns.append(model))
            self.llm_engine = SimpleNamespace(engine_core=core, vllm_config=None)
            self.renderer = object.__new__(cls)

        def get_tokenizer(self) -> Any:
            return tokenizer

    return StandIn


@pytest.fixture
def stand_in(monkeypatch):
    """Install a vllm.LLM stand-in (`_stand_in`'s arguments) for VLLMEngine; returns its class."""
    import vllm

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")

    def install(*args: Any, **kwargs: Any) -> type:
        cls = _stand_in(*args, **kwargs)
        monkeypatch.setattr(vllm, "LLM", cls)
        return cls

    return install


# -- 4. transformers: a Mistral-format tokenizer has no Jinja template ------------------------------------------


def test_the_transformers_engine_refuses_what_a_mistral_common_tokenizer_does_not_take(tmp_path):
    """transformers gives MistralCommonBackend for a folder with tekken.json; its get_chat_template raises
    NotImplementedError by design: the mistral rule decides, as a RunFailed, before any weight is loaded."""
    from diagsafe_local.engines.transformers_engine import TransformersEngine

    model = _tekken_model(tmp_path)
    config = JudgeConfig(kind="transformers", model=str(model), dtype="float32")
    with pytest.raises(RunFailed, match="judge 'nemotron-3.5' sends the chat template argument 'enable_thinking'.*"):
        TransformersEngine(config, template_arguments={"enable_thinking": "nemotron-3.5"})


# -- 3. mistral_common takes reasoning_effort only from tokenizer version 15 --------------------------------------


@pytest.mark.slow  # four tokenizers loaded (~3 s)
def test_reasoning_effort_is_accepted_only_where_the_tokenizer_version_takes_it(tmp_path, stand_in):
    """vLLM passes reasoning_effort to mistral_common only for a tokenizer of version 15 or later
    (tokenizers/mistral.py, MistralTokenizer.apply_chat_template) and drops it below; transformers passes it on,
    and mistral_common refuses it below 15. Both engines refuse it below 15 and take it from 15."""
    from vllm.tokenizers.mistral import MistralTokenizer

    from diagsafe_local.engines.transformers_engine import TransformersEngine
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    messages = [{"role": "user", "content": "is this harmful?"}]
    arguments = {"reasoning_effort": "a-plugin-judge"}
    for version, takes in (("v13", False), ("v15", True)):
        model = _tekken_model(tmp_path / version, version)
        tokenizer = MistralTokenizer.from_pretrained(str(model))
        effort = tokenizer.apply_chat_template(messages, add_generation_prompt=True, reasoning_effort="high")
        assert (effort != tokenizer.apply_chat_template(messages, add_generation_prompt=True)) == takes
        stand_in(tokenizer, "mistral:MistralRenderer")
        config = JudgeConfig(model=str(model), tokenizer_mode="mistral")
        transformers_config = JudgeConfig(kind="transformers", model=str(model), dtype="float32")
        refused = f"'reasoning_effort'.*tokenizer version {version}"
        if takes:
            VLLMEngine(config, template_arguments=arguments).close()
            with pytest.raises(DiagsafeError, match="could not load"):  # past the check: no weights in the folder
                TransformersEngine(transformers_config, template_arguments=arguments)
        else:
            with pytest.raises(RunFailed, match=refused):
                VLLMEngine(config, template_arguments=arguments)
            with pytest.raises(RunFailed, match=refused):
                TransformersEngine(transformers_config, template_arguments=arguments)


# -- 5. named chat templates (tokenizer.chat_template is a dict) --------------------------------------------------


@pytest.fixture
def named_templates(tiny_models, tmp_path):
    """The tiny judge model with a named template beside its default one (additional_chat_templates/, as
    Hermes and Command R ship them): transformers then gives a dict as tokenizer.chat_template."""
    from transformers import AutoTokenizer

    model = Path(shutil.copytree(tiny_models["judge"], tmp_path / "named"))
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool_use.jinja").write_text(NAMED_TOOL_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    assert isinstance(tokenizer.chat_template, dict) and set(tokenizer.chat_template) == {"default", "tool_use"}
    return model, tokenizer


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.slow  # the tiny models (shared with the other slow tests)
def test_both_engines_record_the_template_they_render_of_named_templates(named_templates, stand_in):
    """Each engine loads such a model and records the hash of the template it renders (the default one), and
    checks template arguments against that one: `policy`, read only by the named tool_use template, is refused."""
    from diagsafe_local.engines.transformers_engine import TransformersEngine
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    model, tokenizer = named_templates
    default = tokenizer.chat_template["default"]
    stand_in(tokenizer, "hf:HfRenderer")
    engines = [
        lambda **kw: TransformersEngine(EngineConfig(kind="transformers", model=str(model), dtype="float32"), **kw),
        lambda **kw: VLLMEngine(EngineConfig(model=str(model), max_model_len=256), **kw),
    ]
    for make in engines:
        engine = make()
        assert engine.info.chat_template_hash == _sha(default)
        engine.close()
        with pytest.raises(RunFailed, match="judge 'singguard' sends the chat template argument 'policy'"):
            make(template_arguments={"policy": "singguard"})
    # the pre-load identity holds the named templates as files of the model a run loads
    before = model_fingerprint(str(model))
    (model / "additional_chat_templates" / "tool_use.jinja").write_text(NAMED_TOOL_TEMPLATE + " ")
    assert model_fingerprint(str(model)) != before


def test_a_vllm_engine_that_fails_after_loading_is_closed(tmp_path, stand_in):
    """Whatever fails after vllm.LLM(...) returned (a check, reading the tokenizer), the engine is shut down
    before the error goes on: on CUDA its GPU memory would otherwise stay held by this process."""
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(f"a tokenizer that fails ({name})")

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cls = stand_in(Broken(), "hf:HfRenderer")
    with pytest.raises(RuntimeError, match="a tokenizer that fails"):
        VLLMEngine(EngineConfig(model=str(model), max_model_len=256))
    assert cls.shutdowns == [str(model)]


# -- 1. load_format npcache: vLLM writes np/ into the model directory and loads it from then on -------------------


def test_npcache_is_refused_naming_the_field_and_why(tmp_path):
    """weight_utils.np_cache_weights_iterator converts the .bin files into <model>/np once and reads np/ on every
    later load, whatever the .bin hold then: the directory's identity changes on the first load, and a re-saved
    checkpoint would be judged by the stale cache. A config naming it is a usage error (exit 2)."""
    import inspect

    from vllm.model_executor.model_loader import weight_utils

    source = inspect.getsource(weight_utils.np_cache_weights_iterator)
    assert 'os.path.join(hf_folder, "np")' in source and "if not os.path.exists(weight_names_file)" in source
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "h1", "prompt": "p"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"dataset: {{path: {items}}}\ntarget: {{model: m, engine_kwargs: {{load_format: npcache}}}}\n"
        f"judge: {{model: j}}\noutput_dir: {tmp_path / 'out'}\n"
    )
    result = CliRunner().invoke(app, ["run", str(config)])
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "load_format 'npcache'" in result.output and "np/" in result.output
    assert "Traceback" not in result.output


# -- 2. renderers vLLM picks by architecture read only their own arguments ----------------------------------------


@pytest.mark.slow  # the tiny models (shared with the other slow tests)
def test_a_renderer_other_than_jinjas_or_mistrals_takes_no_template_argument(tiny_models, stand_in):
    """vLLM replaces tokenizer_mode auto by inkling, kimi_k3, deepseek_v32, ... by architecture (config/model.py)
    and renders with that mode's renderer, which reads its own few arguments, not the tokenizer's Jinja template
    (renderers/inkling.py InklingRenderer._render): an argument the template reads is still refused, naming the
    renderer, its mode and the tokenizer_mode: hf override; the engine is shut down. Under HfRenderer it passes."""
    from transformers import AutoTokenizer

    from diagsafe_local.engines.vllm_engine import VLLMEngine

    model = str(tiny_models["judge"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}{{ policy }}"
    config = EngineConfig(model=model, max_model_len=256)
    cls = stand_in(tokenizer, "inkling:InklingRenderer", mode="inkling")
    with pytest.raises(RunFailed, match="InklingRenderer.*tokenizer mode 'inkling'.*tokenizer_mode: hf") as refused:
        VLLMEngine(config, template_arguments={"policy": "singguard"})
    assert "judge 'singguard'" in str(refused.value) and cls.shutdowns == [model]
    VLLMEngine(config).close()  # no argument: nothing to refuse
    stand_in(tokenizer, "hf:HfRenderer")
    VLLMEngine(config, template_arguments={"policy": "singguard"}).close()
