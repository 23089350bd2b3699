"""What identifies an engine's model, for manifests and for the content keys that decide what a resumed run
may reuse: installed package versions, a model directory's content hash (the files a run loads of it), the CUDA
check."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import model_files
from diagsafe_local.core.fingerprint import cached_fingerprint, model_fingerprint
from diagsafe_local.engines.kinds import capabilities


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (absent ones omitted)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def model_json(model: str, name: str) -> tuple[dict[str, Any], Path] | None:
    """A JSON file of a model (config.json, adapter_config.json) and where it lies: in the model's directory, or,
    for a hub id, in the local hub cache (never downloaded here). None where neither holds a readable one."""
    path = Path(model).expanduser()
    try:
        found: Path | None = path / name if (path / name).is_file() else None
        if found is None and model.count("/") <= 1 and not path.is_absolute() and not path.exists():
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, name)
            found = Path(cached) if isinstance(cached, str) else None
        data = json.loads(found.read_text()) if found is not None else None
    except (OSError, ValueError):  # a name no file system holds, not a hub id, a file that does not read
        return None
    return (data, found) if isinstance(data, dict) and found is not None else None


class EngineIdentity(BaseModel):
    """The model an engine config points at, by content where it is local (a new checkpoint written to the same
    path is a different model): kind, model, revision, LoRA adapter, chat template file, and their fingerprints."""

    model_config = ConfigDict(frozen=True)

    kind: str
    model: str | None
    revision: str | None = None
    lora: str | None = None
    model_hash: str | None = None
    lora_hash: str | None = None
    base_url: str | None = None
    chat_template: str | None = None
    chat_template_hash: str | None = None

    def key(self) -> dict[str, Any]:
        """What the content keys of answers and verdicts are made from. A chat template file outside the model
        directory shapes every prompt: edited in place, it is another model as far as reusing goes (present only
        when set, so other runs keep their keys)."""
        data = self.model_dump(exclude={"chat_template", "chat_template_hash"})
        return data | ({"chat_template_hash": self.chat_template_hash} if self.chat_template else {})


def engine_identity(config: Any) -> EngineIdentity:
    """The identity (see `EngineIdentity`) of an engine config."""
    lora = getattr(config, "lora", None)
    template = getattr(config, "chat_template", None)
    return EngineIdentity(
        kind=config.kind,
        model=config.model,
        revision=config.revision,
        lora=lora,
        model_hash=cached_fingerprint(config.model, model_files.load_format(config)) if config.model else None,
        lora_hash=cached_fingerprint(lora, model_files.ADAPTER) if lora else None,
        base_url=config.base_url,
        chat_template=template,
        chat_template_hash=cached_fingerprint(template) if template else None,
    )


def model_as_loaded(config: Any) -> tuple[str, str | None]:
    """The model (and revision) a local engine is given: offline (HF_HUB_OFFLINE, which `run --offline` sets), a
    hub id by its snapshot in the hub cache. vLLM cannot list an offline repository
    (vllm/transformers_utils/repo_utils.py, `list_repo_files` returns []), so `load_format: auto` takes `hf`
    and loads the HF-format weights where the snapshot holds Mistral's consolidated*.safetensors
    (model_executor/model_loader/default_loader.py, `DefaultModelLoader._prepare_weights`), and its tokenizer
    mode misses Mistral's likewise; given the snapshot's path, vLLM applies the rule the model's identity
    (`hub_snapshot_hash`, `core.model_files`) follows, as it does online."""
    from huggingface_hub import constants

    root = hub_snapshot(config) if constants.HF_HUB_OFFLINE else None
    return (str(root), None) if root is not None else (config.model, config.revision)


def hub_snapshot(config: Any) -> Path | None:
    """A model named by hub id and loaded here: the hub cache's snapshot of it. None: a local path, a model behind
    an API (whatever it serves under that name), or no snapshot in the cache (nothing is downloaded here)."""
    model = config.model
    if not model or not capabilities(config.kind).local or Path(model).expanduser().exists():
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, revision=config.revision, local_files_only=True))
    except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError), or not a hub id
        return None


def hub_snapshot_hash(config: Any) -> str | None:
    """A model named by hub id and loaded here (`hub_snapshot`): its snapshot by content (the files a run loads,
    as for a local directory), which a copy of it (a pack's) is by content too."""
    root = hub_snapshot(config)
    return model_fingerprint(str(root), model_files.load_format(config)) if root is not None else None
