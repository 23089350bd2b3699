"""The files of a model or LoRA adapter directory that a run loads, as vLLM picks them, and those it does not.

Weights, by vLLM's own rule (vllm 0.32):

- a model: `vllm/model_executor/model_loader/default_loader.py`, `DefaultModelLoader._prepare_weights`, globs the
  directory's top level for one pattern after another and loads the first that matches. `load_format: auto` is
  `mistral` (`consolidated*.safetensors`) where such a file exists, else `hf`: `*.safetensors`, then `*.bin`, then
  `*.pt` (`fall_back_to_pt`). Safetensors are kept to those the index names
  (`weight_utils.filter_duplicate_safetensors_files`: model.safetensors.index.json, Mistral's
  consolidated.safetensors.index.json), the others lose the trainer's files
  (`weight_utils.filter_files_not_needed_for_inference`). These are the formats of `DefaultModelLoader`
  (`model_executor/model_loader/__init__.py`, `get_model_loader`'s `_LOAD_FORMAT_TO_MODEL_LOADER`; `LoadConfig`,
  `vllm/config/load.py`) but npcache, which loads a cache of the .bin files it writes into the directory (np/) on
  its first load and never renews: every other loader runs weights that are not the directory's (dummy: random
  ones; tensorizer, ipc_cache, modelexpress, runai_streamer, sharded_state: read from elsewhere, or a plugin's), so
  an engine config naming one, or npcache, is refused (`engines.config`). A model that runs its own code keeps
  every weight file;
- the transformers engines (`transformers` and `classifier` kinds): `transformers/modeling_utils.py`,
  `_get_resolved_checkpoint_files`: config.json's `transformers_weights` (a file or a safetensors index inside the
  directory), else model.safetensors, else the shards model.safetensors.index.json names, else
  pytorch_model.bin, else the shards pytorch_model.bin.index.json names;
- a LoRA adapter: `vllm/lora/lora_model.py`, `LoRAModel.from_local_checkpoint`: adapter_model.safetensors, else
  adapter_model.bin, else adapter_model.pt.

Every other file is loaded or may be (config, generation config, tokenizer files, chat templates, a pooling
config in its folder, a model's own code), except a model card, licence texts, images, the repository's own
files (.git*, and the folders .git and .cache that git and `hf download --local-dir` keep), which nothing loads,
and, but for a model that runs its own code, the top-level folder original/ (Meta's and OpenAI's own format of
the weights and tokenizer), which vLLM never fetches (`vllm/config/load.py`, `LoadConfig.ignore_patterns`'
default "original/**/*", which engine_kwargs cannot change) nor reads: so the hub snapshot vLLM fetched and the
whole repository `pack` fetches are one checkpoint.

`pack` copies these files, and `core.fingerprint` hashes them: a checkpoint is what a run loads of it.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

WEIGHT_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".onnx_data", ".ot",
    ".tflite",
)  # fmt: skip
DOCUMENTS = ("README*", "LICENSE*", "LICENCE*", "NOTICE*", "USE_POLICY*", "*.md", "*.png", "*.jpg", "*.jpeg", "*.gif",
             "*.svg", "*.webp", "*.pdf", ".git*")  # fmt: skip
# vLLM's patterns by load format, tried in order (`_prepare_weights`; fall_back_to_pt adds *.pt where the format
# is not a safetensors one), and the index that names the safetensors a format loads.
PATTERNS: dict[str, tuple[str, ...]] = {
    "hf": ("*.safetensors", "*.bin", "*.pt"),
    "safetensors": ("*.safetensors",),
    "mistral": ("consolidated*.safetensors",),
    "pt": ("*.pt",),
    "fastsafetensors": ("*.safetensors",),
    "instanttensor": ("*.safetensors",),
}
DIRECTORY_FORMATS = frozenset({"auto", *PATTERNS})  # vLLM's load formats that read the directory's own weights
INDEX = {"mistral": "consolidated.safetensors.index.json"}
SAFETENSORS_INDEX = "model.safetensors.index.json"
NOT_FOR_INFERENCE = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
REPOSITORY_FOLDERS = {".git", ".cache"}
IGNORED_FOLDER = "original"  # vLLM's LoadConfig.ignore_patterns default, "original/**/*"
ADAPTER = "adapter"  # as a load format: the directory of a LoRA adapter, read by vLLM's LoRA loader
OWN_CODE = "own-code"  # as a load format: a model that runs its own code, which may read any weight file
TRANSFORMERS = "transformers"  # as a load format: transformers' from_pretrained, for the engine kinds that use it
TRANSFORMERS_KINDS = ("transformers", "classifier")
# from_pretrained's choice in a local directory, in its order: a file, or an index whose weight_map names shards
TRANSFORMERS_WEIGHTS = ("model.safetensors", SAFETENSORS_INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")


def load_format(engine: Any) -> str:
    """The load format an engine config (or its JSON, as a run's manifest records the config) reads its model
    with: a vLLM engine's `load_format` (vLLM's default `auto`); the transformers engines' `TRANSFORMERS`; `hf`
    for any other kind; for a model that runs its own code, `OWN_CODE`."""
    if isinstance(engine, Mapping):
        kind, settings, own = engine.get("kind"), engine.get("engine_kwargs") or {}, engine.get("trust_remote_code")
    else:
        kind, settings = engine.kind, getattr(engine, "engine_kwargs", {})
        own = getattr(engine, "trust_remote_code", False)
    if own:
        return OWN_CODE
    if kind in TRANSFORMERS_KINDS:
        return TRANSFORMERS
    return str(settings.get("load_format", "auto")) if kind == "vllm" else "hf"


def target_load_format(config: Mapping[str, Any], index: int) -> str:
    """The load format of the target at `index` of a run config as a manifest records it (`auto` where it does
    not say: a hash that then differs refuses, never matches)."""
    targets = config.get("targets") or []
    target = targets[index] if index < len(targets) else None
    return load_format(target) if isinstance(target, Mapping) else "auto"


def loaded_files(directory: Path, load_format: str) -> list[tuple[Path, str]]:
    """The files a run loads from a model directory read with `load_format` (`ADAPTER`: an adapter's), with their
    paths inside it, in path order."""
    weights = adapter_weights(directory) if load_format == ADAPTER else loaded_weights(directory, load_format)
    own = load_format == OWN_CODE
    found = ((path, path.relative_to(directory).as_posix()) for path in sorted(directory.rglob("*")))
    return [(path, relative) for path, relative in found if path.is_file() and is_loaded(relative, weights, own)]


def loaded_weights(directory: Path, load_format: str) -> set[str] | None:
    """The names of the weight files vLLM loads from `directory` with `load_format` (None: a format this rule
    does not know, or no file its patterns match: every weight file is kept)."""
    if load_format == TRANSFORMERS:
        return transformers_weights(directory)
    if load_format == "auto":
        load_format = "mistral" if glob.glob("consolidated*.safetensors", root_dir=directory) else "hf"
    found: list[str] = []
    for pattern in PATTERNS.get(load_format, ()):
        found = sorted(glob.glob(pattern, root_dir=directory))
        if found:
            break
    if not found:
        return None
    if found[0].endswith(".safetensors"):
        listed = _indexed(directory / INDEX.get(load_format, SAFETENSORS_INDEX))
        return set(found) & listed if listed is not None else set(found)
    return {name for name in found if not name.endswith(NOT_FOR_INFERENCE)}


def transformers_weights(directory: Path) -> set[str] | None:
    """The weight files (paths inside `directory`) transformers' from_pretrained loads from it (None: none of its
    names, or a transformers_weights it refuses: every weight file kept)."""
    try:
        named = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("transformers_weights")
    except (OSError, ValueError, AttributeError):
        named = None
    if named is not None:
        inside = isinstance(named, str) and ".." not in PurePosixPath(named).parts and not named.startswith("/")
        if not inside or not named.endswith((".safetensors", ".safetensors.index.json")):
            return None
        candidates: tuple[str, ...] = (named,)
    else:
        candidates = TRANSFORMERS_WEIGHTS
    found = next((name for name in candidates if (directory / name).is_file()), None)
    if found is None or not found.endswith(".index.json"):
        return {found} if found is not None else None
    shards = _indexed(directory / found)
    folder = PurePosixPath(found).parent
    return {(folder / shard).as_posix() for shard in shards} if shards is not None else None


def _indexed(index: Path) -> set[str] | None:
    try:
        return set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no index (or not one vLLM could read either): every file its pattern matched


def adapter_weights(directory: Path) -> set[str] | None:
    """The adapter weights file vLLM's LoRA loader reads (None: none of its names, every weight file kept)."""
    found = next((name for name in ADAPTER_WEIGHTS if (directory / name).is_file()), None)
    return {found} if found is not None else None


def is_loaded(relative: str, weights: set[str] | None, own_code: bool = False) -> bool:
    """Whether a run loads the file at `relative` (inside the directory) where it loads `weights` (`own_code`: a
    model that runs its own code, which may read original/ too)."""
    path = PurePosixPath(relative)
    if REPOSITORY_FOLDERS & set(path.parts) or any(path.match(pattern) for pattern in DOCUMENTS):
        return False
    if path.parts[0] == IGNORED_FOLDER and len(path.parts) > 1 and not own_code:
        return False
    if path.name.lower().endswith(WEIGHT_SUFFIXES):
        return weights is None or path.as_posix() in weights
    return True
