"""The hf extra allows transformers>=4.44: the transformers engine finds a Mistral-format tokenizer under the
class name its transformers gives it (5: MistralCommonBackend, 4.54-4.57: MistralCommonTokenizer, older: no
module at all), and loads every other model whatever the name."""

from __future__ import annotations

import sys

from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.transformers_engine import TransformersEngine, _renders_with_mistral_common
from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

MODULE = "transformers.tokenization_mistral_common"


def test_the_transformers_engine_loads_with_a_transformers_4_the_hf_extra_allows(tmp_path, monkeypatch):
    import transformers
    import transformers.tokenization_mistral_common as tmc

    backend = tmc.MistralCommonBackend
    mistral = backend.__new__(backend)  # what transformers gives for a tekken.json (loading one takes seconds)
    model = build_tiny_chat_model(tmp_path / "m", seed=1)
    plain = transformers.AutoTokenizer.from_pretrained(str(model))
    monkeypatch.setattr(tmc, "MistralCommonTokenizer", backend, raising=False)
    monkeypatch.delattr(tmc, "MistralCommonBackend")  # as in transformers 4.54-4.57
    assert _renders_with_mistral_common(mistral) and not _renders_with_mistral_common(plain)
    TransformersEngine(EngineConfig(kind="transformers", model=str(model), dtype="float32")).close()
    monkeypatch.setitem(sys.modules, MODULE, None)  # before 4.54: no such module (import raises ImportError)
    assert not _renders_with_mistral_common(plain)
    TransformersEngine(EngineConfig(kind="transformers", model=str(model), dtype="float32")).close()
