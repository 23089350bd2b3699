"""The adversarial review's pack defects (fix round 4): a lock whose model part has no path is refused naming the
lock and the part, never run with the model 'None' (D5); a pack's check is trusted only by the processes of the run
that made it, and every later run hashes the pack again (D3: a write through a still-dirty shared mapping changes
bytes and no time)."""

from __future__ import annotations

import json

import yaml
from test_pack import _pack, packable  # noqa: F401  (a fixture: a config whose parts can be packed)
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
