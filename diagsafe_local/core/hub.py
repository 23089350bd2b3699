"""Resolve a dataset argument: a local file, or a Hugging Face dataset id downloaded once into the cache.

`owner/name` picks the repository's only JSON/JSONL file; `owner/name:path/in/repo.jsonl` names one.
Downloads go to `<cache>/hub` (DIAGSAFE_CACHE, else ~/.cache/diagsafe-local). Each resolved id is
remembered in `<cache>/hub/resolved.json`, so the same id resolves to the same file offline afterwards
(HF_HUB_OFFLINE=1, or simply no network).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from diagsafe_local.core import atomic
from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DataError, DiagsafeError

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(:[\w./-]+)?$")
DATA_PATTERNS = ("*.json", "*.jsonl")


def download(url: str, target: Path) -> Path:
    """Fetch `url` into `target` once (through a `.partial` file, so a broken download leaves nothing)."""
    import shutil
    import urllib.request

    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(target)
    return target


def resolve_dataset(spec: str, patterns: tuple[str, ...] = DATA_PATTERNS) -> Path:
    """Local path for `spec` (a file path, an http(s) URL or a hub id), downloading it once into the cache if
    needed; for a hub id without a file name, the repository's one file matching `patterns` is used."""
    path = Path(spec)
    if path.is_dir():
        raise DataError(spec, None, None, "a directory, not a data file: name the file inside it")
    if path.exists():
        return path
    if spec.startswith(("https://", "http://")):
        import hashlib

        name = spec.rstrip("/").rsplit("/", 1)[-1] or "download"
        target = cache_dir() / "hub" / "urls" / hashlib.sha256(spec.encode()).hexdigest()[:16] / name
        try:
            return download(spec, target)
        except Exception as exc:  # network errors of every kind mean the same to the user
            raise HubUnreachable(
                f"could not download {spec} ({type(exc).__name__}: {exc}). Offline? Fetch it once where you are "
                "online (same DIAGSAFE_CACHE), or pass a local file."
            ) from None
    if not _HUB_ID.match(spec):
        raise DataError(spec, None, None, "no such file (nor a Hugging Face dataset id like owner/name)")
    repo_id, _, filename = spec.partition(":")
    try:
        chosen = _download(spec, repo_id, filename, patterns)
    except HubUnreachable:
        remembered = _resolved().get(spec)
        if remembered and (cache_dir() / "hub" / remembered).is_file():
            log.info("%s: the hub is out of reach; using the copy fetched before", spec)
            return cache_dir() / "hub" / remembered
        raise
    _remember(spec, chosen)
    return chosen


class HubUnreachable(DiagsafeError):
    """The hub could not be asked (offline, unknown repository, refused)."""


def _download(spec: str, repo_id: str, filename: str, patterns: tuple[str, ...]) -> Path:
    try:
        from huggingface_hub import snapshot_download

        root = Path(
            snapshot_download(
                repo_id=repo_id,
                repo_type="dataset",
                allow_patterns=[filename] if filename else list(patterns),
                cache_dir=cache_dir() / "hub",
            )
        )
    except Exception as exc:  # the hub client raises many types; all mean "could not fetch"
        raise HubUnreachable(
            f"could not fetch dataset '{repo_id}' from the Hugging Face Hub ({type(exc).__name__}: {exc}). "
            "Offline? Fetch it once on a machine with internet (same DIAGSAFE_CACHE), or pass a local file."
        ) from None
    if filename:
        chosen = root / filename
        if not chosen.is_file():
            raise DataError(spec, None, None, f"the dataset has no file '{filename}'")
        return chosen
    files = sorted({p for pattern in patterns for p in root.rglob(pattern)})
    if len(files) != 1:
        listing = ", ".join(str(f.relative_to(root)) for f in files) or "none"
        raise DataError(
            spec,
            None,
            None,
            f"expected one file matching {', '.join(patterns)} in the dataset, found: {listing}; name one as {repo_id}:FILE",
        )
    return files[0]


def _resolved() -> dict[str, str]:
    path = cache_dir() / "hub" / "resolved.json"
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _remember(spec: str, chosen: Path) -> None:
    """Record which cached file `spec` resolved to (relative to the hub cache), for offline use later."""
    hub = cache_dir() / "hub"
    relative = os.path.relpath(chosen.absolute(), hub.absolute())  # the snapshot path, not its blob
    if relative.startswith(".."):
        return  # not under our cache
    known = _resolved()
    if known.get(spec) != relative:
        atomic.write_text(hub / "resolved.json", json.dumps({**known, spec: relative}, indent=1) + "\n")
