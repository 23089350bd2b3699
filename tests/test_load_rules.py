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
        if loader == "DefaultModelLoader" and fmt != "npcache":  # npcache: its np/ cache (test_gpu5_engine_checks)
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


MISTRALISH = "org/mistralish"


@pytest.fixture
def mistralish(tmp_path, monkeypatch):
    """A hub id in the hub cache (as `hf download` leaves it) with both Mistral's and HF's weights, offline."""
    import huggingface_hub.constants as hub
    from test_pack import _hub_cache

    source = tmp_path / "source"
    source.mkdir()
    shards = json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    for name, text in {"config.json": "{}", "params.json": "{}", "consolidated.safetensors": "x",
                       "model-00001-of-00001.safetensors": "y", "model.safetensors.index.json": shards}.items():  # fmt: skip
        (source / name).write_text(text)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(_hub_cache(tmp_path / "hub", source, MISTRALISH)))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return next((tmp_path / "hub").glob("models--org--mistralish/snapshots/*"))


def test_offline_a_hub_id_is_given_to_vllm_as_its_cached_snapshot(mistralish, tmp_path, monkeypatch):
    """Offline, vLLM cannot list a hub repository and would load another choice of weights than its snapshot's
    (the next test); given the snapshot's path, it applies the rule the model's identity follows. Online, or for a
    model not in the cache, a local directory or an API's, the model is given as named."""
    import huggingface_hub.constants as hub

    from diagsafe_local.engines.identity import model_as_loaded

    assert model_as_loaded(EngineConfig(model=MISTRALISH, revision="main")) == (str(mistralish), None)
    local = str(_model(tmp_path / "ckpt"))
    api = EngineConfig(model=MISTRALISH, kind="openai", base_url="http://127.0.0.1:9/v1")
    for config in (EngineConfig(model="org/not-cached"), EngineConfig(model=local), api):
        assert model_as_loaded(config) == (config.model, None)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    assert model_as_loaded(EngineConfig(model=MISTRALISH, revision="main")) == (MISTRALISH, "main")


@pytest.mark.slow  # imports vLLM's model loader (~10 s)
def test_offline_vllm_loads_the_weights_a_hub_models_identity_covers(mistralish, monkeypatch):
    """vLLM's own choice (default_loader.py, DefaultModelLoader._prepare_weights, auto) of what it is given offline
    is the weights model_files hashes of the snapshot: Mistral's consolidated.safetensors. Given the hub id
    offline, it lists nothing (transformers_utils/repo_utils.py, list_repo_files), takes hf and loads the shards."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from diagsafe_local.core.model_files import loaded_weights
    from diagsafe_local.engines.identity import model_as_loaded

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, revision = model_as_loaded(EngineConfig(model=MISTRALISH))
    _, files, _, _ = DefaultModelLoader(LoadConfig(load_format="auto"))._prepare_weights(
        model, None, revision, True, None
    )
    assert {Path(f).name for f in files} == loaded_weights(mistralish, "auto") == {"consolidated.safetensors"}
