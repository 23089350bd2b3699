"""The adversarial review's pack defects (fix round 4): a lock whose model part has no path is refused naming the
lock and the part, never run with the model 'None' (D5); a pack's check is trusted only by the processes of the run
that made it, and every later run hashes the pack again (D3: a write through a still-dirty shared mapping changes
bytes and no time)."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from test_pack import _pack, packable  # noqa: F401  (a fixture: a config whose parts can be packed)
from test_pack_node import hashed  # noqa: F401  (a fixture: the bytes open_pack hashes)
from test_series import scripted  # noqa: F401  (a fixture: every engine the pipeline makes is scripted)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.pack import LOCK


def test_a_lock_naming_a_model_part_with_no_path_is_refused_naming_the_lock_and_the_part(packable, tmp_path, scripted):  # noqa: F811
    """Only `judge.validation: auto`, found empty when packing, may have no path: a model part with none (its files
    taken out of the lock too, so every listed file checks) is the lock lying, not a model named 'None'."""
    out = tmp_path / "pack"
    _pack(packable, out)
    lock = json.loads((out / LOCK).read_text())
    judge = yaml.safe_load(packable.read_text())["judge"]["model"]
    (part,) = [p for p in lock["parts"] if p["kind"] == "model" and p["reference"] == judge]
    dropped, part["path"] = part["path"], None
    lock["files"] = [f for f in lock["files"] if not f["path"].startswith(dropped + "/")]
    for path in sorted((out / dropped).rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (out / dropped).rmdir()
    (out / LOCK).write_text(json.dumps(lock))
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    message = " ".join(result.output.split())
    assert result.exit_code == 3 and isinstance(result.exception, SystemExit), result.output  # no traceback
    assert f"{out / LOCK}:" in message and f"model '{judge}' has no path in the pack" in message, message
    assert "'None'" not in message and not scripted and not (tmp_path / "run").exists()


# -- the pack's check: trusted by the processes of the run that made it, never by a later run ----------------------


def test_a_later_run_hashes_the_pack_again_and_the_shard_processes_of_one_run_do_not(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
    hashed,  # noqa: F811
):
    """The run's process hashes the pack and hands its shard processes a token (`variables`: in their environment)
    naming its record; a process without it (a later run), with a token of no record, one expired or one that is
    not a token hashes every file."""
    from diagsafe_local.core import pack
    from diagsafe_local.evaluation.pack import variables

    out = tmp_path / "pack"
    lock = _pack(packable, out)
    size = sum(f.size for f in lock.files)
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)  # files packed a moment ago count as settled
    run = pack.open_pack(out)
    later = pack.open_pack(out)
    assert sum(hashed) == 2 * size and run.check != later.check
    hashed.clear()
    for name, value in variables(run).items():
        monkeypatch.setenv(name, value)
    for _ in range(4):  # four shard processes of the run
        assert pack.open_pack(out).check == run.check
    assert sum(hashed) == 0
    for token in (later.check + "0", "../" + later.check, "0" * 32):
        monkeypatch.setenv(pack.CHECK_ENV, token)
        pack.open_pack(out)
        assert sum(hashed) == size, token
        hashed.clear()
    monkeypatch.setenv(pack.CHECK_ENV, run.check)
    monkeypatch.setattr(pack, "CHECK_LIFETIME_NS", 0)  # the run's token expired
    pack.open_pack(out)
    assert sum(hashed) == size


def test_a_pack_file_changed_through_a_shared_mapping_after_the_check_is_caught_by_a_later_run(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """On Linux a write through a shared mapping updates the file's times only at the page's first write fault after
    it was cleaned: a second write to a still-dirty page changes the bytes and no time, so a stat says nothing of
    it. A later run hashes the pack again and refuses it."""
    import mmap
    import os

    from diagsafe_local.core import pack
    from diagsafe_local.core.errors import RunFailed

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)  # the stat is recorded as settled
    out = tmp_path / "pack"
    target = max(_pack(packable, out).files, key=lambda f: f.size)
    path = out / target.path
    with open(path, "r+b") as handle:
        mapped = mmap.mmap(handle.fileno(), 0)
        mapped[0:1] = mapped[0:1]  # dirty the page, bytes as packed (times set now)
        run = pack.open_pack(out)
        before = os.stat(path)
        mapped[0:1] = bytes([mapped[0] ^ 0xFF])  # another byte, through the still-dirty page
        mapped.close()
    after = os.stat(path)
    if (after.st_ctime_ns, after.st_mtime_ns) != (before.st_ctime_ns, before.st_mtime_ns):
        pytest.skip("the page was written back between the two writes (a sync elsewhere): rerun")
    assert hashlib.sha256(path.read_bytes()).hexdigest() != target.sha256
    with pytest.raises(RunFailed, match="its bytes are not the ones packed"):
        pack.open_pack(out)
    assert run.check is not None
