"""Which weights a run loads, read in the loaders' own code: a vLLM engine only under a load format that reads
the model directory's own weights (any other runs weights no identity covers, and is a config error), and the
transformers engines in transformers' own order, which a checkpoint's identity then covers."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.fingerprint import model_fingerprint
from diagsafe_local.core.model_files import load_format
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.evaluation.config import load_config


def _vllm_loaders() -> dict[str, str]:
    """vLLM's load formats and the loader class each names, as its `get_model_loader` picks them
    (`vllm/model_executor/model_loader/__init__.py`, `_LOAD_FORMAT_TO_MODEL_LOADER`; read, not imported: ~10 s)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0], "model_executor", "model_loader", "__init__.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_LOAD_FORMAT_TO_MODEL_LOADER":
            assert isinstance(node.value, ast.Dict)
            return {ast.literal_eval(k): ast.unparse(v) for k, v in zip(node.value.keys, node.value.values) if k}
    raise AssertionError("vLLM's table of load formats was not found")


def _model(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors").write_bytes(b"the checkpoint's weights")
    return root


def test_only_a_load_format_that_reads_the_directorys_own_weights_is_accepted(tmp_path):
    """DefaultModelLoader's formats read the directory's weight files (the rule model_files follows); dummy
    initialises random weights, tensorizer, ipc_cache, modelexpress, runai and sharded_state read others, and a
    plugin's format is unknown: each would be evaluated under the checkpoint's name, so each is refused."""
    model = str(_model(tmp_path / "ckpt"))
    loaders = _vllm_loaders()
    assert "dummy" in loaders and loaders["auto"] == "DefaultModelLoader"
    for fmt, loader in [*loaders.items(), ("a_plugins_format", "?"), ({"a": "mapping"}, "?")]:
        if loader == "DefaultModelLoader":
            config = EngineConfig(model=model, engine_kwargs={"load_format": fmt})
            assert model_fingerprint(model, load_format(config)) is not None
        else:
            with pytest.raises(ValueError, match=f"engine_kwargs cannot set load_format {re.escape(repr(fmt))}"):
                EngineConfig(model=model, engine_kwargs={"load_format": fmt})


@pytest.mark.parametrize("key", ["model", "tokenizer", "hf_overrides", "speculative_config", "load_format"])
def test_a_config_whose_engine_kwargs_change_what_runs_is_a_config_error_naming_the_field(tmp_path, key):
    """engine_kwargs go to vllm.LLM after our own arguments: one that names another model, tokenizer, config or
    draft model (or random weights) would run something the recorded identity does not name."""
    value = {"load_format": "dummy", "hf_overrides": {"num_hidden_layers": 1}}.get(key, "/elsewhere/other-model")
    path = tmp_path / "run.yaml"
    path.write_text(
        "dataset: {path: items.jsonl}\n"
        f"target: {{model: m, engine_kwargs: {json.dumps({key: value})}}}\n"
        "judge: {model: j}\noutput_dir: out\n"
    )
    with pytest.raises(DiagsafeError, match=f"run.yaml line 2: targets.0: Value error, engine_kwargs cannot set {key}"):
        load_config(path)


def _sharded_plus_single(root: Path) -> Path:
    """A model directory as a re-save leaves it: shards named by the index, and a model.safetensors beside them."""
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    )
    (root / "model-00001-of-00001.safetensors").write_bytes(b"shard weights")
    (root / "model.safetensors").write_bytes(b"the weights transformers loads")
    (root / "pytorch_model.bin").write_bytes(b"pickled weights")
    return root


def _changes(model: Path, fmt: str, name: str) -> bool:
    before = model_fingerprint(str(model), fmt)
    (model / name).write_bytes((model / name).read_bytes() + b" edited")
    return model_fingerprint(str(model), fmt) != before


@pytest.mark.parametrize("kind", ["transformers", "classifier"])
def test_a_transformers_engines_identity_covers_the_weights_from_pretrained_loads(tmp_path, kind):
    """transformers' `_get_resolved_checkpoint_files` (modeling_utils.py) takes config.json's transformers_weights,
    else model.safetensors, else model.safetensors.index.json's shards, else pytorch_model.bin (and its index)."""
    fmt = load_format({"kind": kind, "model": "m"})
    model = _sharded_plus_single(tmp_path / "ckpt")
    assert _changes(model, fmt, "model.safetensors")
    assert not _changes(model, fmt, "model-00001-of-00001.safetensors")
    assert not _changes(model, fmt, "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    assert _changes(model, fmt, "model-00001-of-00001.safetensors")
    (model / "config.json").write_text('{"model_type": "llama", "transformers_weights": "sub/w.safetensors"}')
    (model / "sub").mkdir()
    (model / "sub" / "w.safetensors").write_bytes(b"the weights config.json names")
    assert _changes(model, fmt, "sub/w.safetensors")
    assert not _changes(model, fmt, "model-00001-of-00001.safetensors")


VLLM_FETCHED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")  # fmt: skip
REPOSITORY_EXTRAS = {
    "llama-3.1": ("original/params.json", "original/tokenizer.model", "original/consolidated.00.pth", "README.md",
                  "LICENSE", "USE_POLICY.md"),
    "gpt-oss": ("original/config.json", "original/dtypes.json", "original/model.safetensors", "metal/model.bin",
                "README.md"),
}  # fmt: skip


def _tree(root: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    return root


@pytest.mark.parametrize("repository", sorted(REPOSITORY_EXTRAS))
def test_the_hub_snapshot_vllm_fetched_is_the_whole_repositorys_checkpoint(tmp_path, repository):
    """validate hashes the hub cache's snapshot as vLLM fetched it, pack the whole repository: the folder
    original/ (Meta's and OpenAI's own format) is what vLLM's LoadConfig.ignore_patterns leaves out by default
    (vllm/config/load.py, "original/**/*"; engine_kwargs cannot change it), and nothing reads it: one checkpoint."""
    fetched = _tree(tmp_path / "fetched", VLLM_FETCHED)
    whole = _tree(tmp_path / "whole", VLLM_FETCHED + REPOSITORY_EXTRAS[repository])
    assert model_fingerprint(str(fetched)) == model_fingerprint(str(whole)) is not None
    own_code = load_format(EngineConfig(model=str(whole), trust_remote_code=True))
    assert model_fingerprint(str(fetched), own_code) != model_fingerprint(str(whole), own_code)  # it may read any
