"""The in-process cache of a model directory's content hash (`engines.identity`) may answer only for the files as
they were hashed: a weight file rewritten in place with its modification time put back (a long-lived `watch`, the
training callback, `api.evaluate` in a notebook) is hashed again, so a run never records weights it did not load."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_pack_node import LOADED, _snapshot

from diagsafe_local.core import fingerprint
from diagsafe_local.core.fingerprint import model_fingerprint
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.identity import engine_identity
from diagsafe_local.evaluation.watch import Scanner


def _rewrite_keeping_times(path: Path, data: bytes) -> None:
    """What a trainer (or an attacker) that restores the old times does: same size, same path, same mtime."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled as soon as they were written (no racy window), so the cache is used."""
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    monkeypatch.setattr(fingerprint, "_FINGERPRINTS", {})


def test_a_weight_file_rewritten_with_its_mtime_put_back_is_hashed_again(tmp_path: Path, settled: None) -> None:
    model = _snapshot(tmp_path / "ckpt", dict(LOADED))
    config = EngineConfig(model=str(model))
    time.sleep(0.02)  # past the file system's timestamp tick: the rewrite gets another ctime
    first = engine_identity(config).model_hash
    assert engine_identity(config).model_hash == first  # cached: the same files
    weights = model / "model.safetensors"
    _rewrite_keeping_times(weights, b"X" * weights.stat().st_size)
    assert engine_identity(config).model_hash == model_fingerprint(str(model)) != first


def test_a_loaded_file_replaced_by_another_of_the_same_size_and_times_is_hashed_again(
    tmp_path: Path, settled: None
) -> None:
    """A file moved over the old one (a new inode) with the old times set on it."""
    model = _snapshot(tmp_path / "ckpt", dict(LOADED))
    config = EngineConfig(model=str(model))
    weights = model / "model.safetensors"
    first = engine_identity(config).model_hash
    stat = weights.stat()
    other = tmp_path / "other"
    other.write_bytes(b"Y" * stat.st_size)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, weights)
    assert engine_identity(config).model_hash == model_fingerprint(str(model)) != first


def test_files_written_within_the_racy_window_are_not_trusted_to_the_cache(tmp_path: Path) -> None:
    """Written and rewritten within one timestamp tick, two versions can share every stat field (git's racy
    entries): a file that new is hashed each time."""
    model = _snapshot(tmp_path / "ckpt", dict(LOADED))
    config = EngineConfig(model=str(model))
    first = engine_identity(config).model_hash
    weights = model / "model.safetensors"
    stat = weights.stat()
    with open(weights, "r+b") as handle:  # in place: same inode
        handle.write(b"Z" * stat.st_size)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert engine_identity(config).model_hash != first


def test_watch_sees_a_checkpoint_re_saved_with_its_mtime_put_back(tmp_path: Path, settled: None) -> None:
    """`watch` asks whether a finished checkpoint's weights are still those its run evaluated (`resaved`)."""
    model = _snapshot(tmp_path / "ckpts" / "checkpoint-100", dict(LOADED))
    scanner = Scanner(tmp_path / "ckpts", settle=0)
    time.sleep(0.02)
    first = scanner.weights(model)
    weights = model / "model.safetensors"
    _rewrite_keeping_times(weights, b"W" * weights.stat().st_size)
    assert scanner.weights(model) == model_fingerprint(str(model)) != first
