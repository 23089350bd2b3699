"""A series trusts a checkpoint by its weights, not its path (issue 43, design point 4): a checkpoint re-saved in
place is evaluated again and never passes on its old run; `latest` is the newest complete checkpoint on disk;
the state's signature binds its series and a sequence that only grows; `report SERIES` applies the gate's rule;
and `watch` holds SIGTERM from its first write."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import test_series
from safetensors.numpy import save_file
from test_series import checkpoint, recorded_series, series_config, watch
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.runs.series_state import read_series

KEY = "k" * 32
scripted = test_series.scripted  # its fixture: every engine scripted, the models asked for listed


def gate(series: Path, which: str, *extra: str):
    command = ["gate", str(series), "--checkpoint", which, "--max-asr", "1", "--allow-degenerate-judge", *extra]
    return CliRunner().invoke(app, command)


def resave(path: Path) -> None:
    """The trainer writes new weights into the same checkpoint directory."""
    save_file({"w": np.ones((64, 64), dtype=np.float32)}, str(path / "model.safetensors"))


def test_a_checkpoint_resaved_in_place_is_refused_then_evaluated_again(tmp_path, scripted):
    train, spec = recorded_series(tmp_path)
    assert watch(tmp_path).exit_code == 0
    assert gate(spec.series_dir, "latest").exit_code == 0
    manifest = json.loads((spec.series_dir / "runs" / "checkpoint-20" / "manifest.json").read_text())
    evaluated = next(iter(manifest["targets"].values()))["model_hash"]

    resave(train / "checkpoint-20")
    for which in ("latest", "20"):
        refused = gate(spec.series_dir, which)
        assert refused.exit_code == 3 and "re-saved since its run" in refused.output, refused.output
    loads = len(scripted)
    again = watch(tmp_path)
    assert again.exit_code == 0 and "checkpoint-20: its weights changed" in again.output, again.output
    assert [m for m in scripted[loads:] if "checkpoint" in m] == [str((train / "checkpoint-20").resolve())]
    entry = read_series(spec.series_dir).checkpoints["checkpoint-20"]
    assert entry.status == "finished" and entry.model_hash not in (None, evaluated)
    assert read_series(spec.series_dir).checkpoints["checkpoint-10"].model_hash is not None  # the series records it
    assert list((spec.series_dir / "runs" / ".resaved").iterdir())  # the old weights' run is kept aside
    assert gate(spec.series_dir, "latest").exit_code == 0


def test_latest_is_the_newest_complete_checkpoint_on_disk(tmp_path, scripted):
    train, spec = recorded_series(tmp_path)
    assert watch(tmp_path).exit_code == 0
    checkpoint(train, "checkpoint-40", state=False)  # still being written: not a checkpoint yet
    assert gate(spec.series_dir, "latest").exit_code == 0
    checkpoint(train, "checkpoint-30")  # complete, and watch has not seen it
    unseen = gate(spec.series_dir, "latest")
    assert unseen.exit_code == 3 and "checkpoint-30" in unseen.output and "not evaluated yet" in unseen.output
    assert gate(spec.series_dir, "20").exit_code == 0  # an older one is gated only when named


def test_an_older_or_another_series_signed_state_is_refused(tmp_path, scripted, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    train, spec = recorded_series(tmp_path)
    assert watch(tmp_path).exit_code == 0
    series = spec.series_dir
    old = {name: (series / name).read_bytes() for name in ("series.state.json", "signature.json")}
    checkpoint(train, "checkpoint-30")
    assert watch(tmp_path).exit_code == 0
    assert gate(series, "20", "--require-signature").exit_code == 0
    newest = {name: (series / name).read_bytes() for name in old}
    for name, data in old.items():
        (series / name).write_bytes(data)  # an older signed state of the same series, put back
    older = gate(series, "20", "--require-signature")
    assert older.exit_code == 3 and "older state" in older.output, older.output
    resumed = watch(tmp_path)
    assert resumed.exit_code == 3 and "older state" in resumed.output  # the key holder does not sign it again
    for name, data in newest.items():
        (series / name).write_bytes(data)
    assert watch(tmp_path).exit_code == 0

    other = tmp_path / "other-series"
    assert watch(tmp_path, "--out", str(other)).exit_code == 0  # a second series of the same training run
    for name in ("series.state.json", "signature.json"):
        shutil.copy(other / name, series / name)  # its signed state
    foreign = gate(series, "20", "--require-signature")
    assert foreign.exit_code == 3 and "another series" in foreign.output, foreign.output
    shutil.copy(other / "series.sequence", series / "series.sequence")  # and its record of the newest
    copied = gate(series, "20", "--require-signature")
    assert copied.exit_code == 3 and f"at {other.resolve()}" in copied.output, copied.output


def test_the_series_report_checks_the_signature_and_that_each_run_is_its_checkpoints(tmp_path, scripted, monkeypatch):
    train, spec = recorded_series(tmp_path)
    assert watch(tmp_path).exit_code == 0
    state_file = spec.series_dir / "series.state.json"
    state = json.loads(state_file.read_text())
    state["checkpoints"]["checkpoint-20"]["run_dir"] = state["checkpoints"]["checkpoint-10"]["run_dir"]
    state_file.write_text(json.dumps(state))  # step 20 now names checkpoint 10's run (checkpoint 10 complies less)
    report = CliRunner().invoke(app, ["report", str(spec.series_dir)])
    assert report.exit_code == 0, report.output
    points = {p["name"]: p for p in json.loads((spec.series_dir / "series.json").read_text())["points"]}
    assert points["checkpoint-20"]["status"] == "unverified" and points["checkpoint-20"]["asr"] is None
    assert "is not the run of" in " ".join(points["checkpoint-20"]["problems"])
    assert points["checkpoint-10"]["status"] == "finished"

    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    checkpoint(train, "checkpoint-30")
    assert watch(tmp_path).exit_code == 0  # signs the state it writes
    signed = json.loads(state_file.read_text())
    signed["checkpoints"]["checkpoint-30"]["run_dir"] = signed["checkpoints"]["checkpoint-10"]["run_dir"]
    state_file.write_text(json.dumps(signed, indent=2) + "\n")
    edited = CliRunner().invoke(app, ["report", str(spec.series_dir)])
    assert edited.exit_code == 3 and "changed since it was signed" in edited.output, edited.output


def test_sigterm_during_watchs_first_state_write_stops_it_cleanly(tmp_path, monkeypatch):
    import diagsafe_local.evaluation.watch as watching

    series_config(tmp_path)
    (tmp_path / "train").mkdir()
    original = watching.update_series
    calls: list[int] = []

    def first_write_signalled(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)  # as SLURM's SIGTERM lands during the first write
        return original(*args, **kwargs)

    monkeypatch.setattr(watching, "update_series", first_write_signalled)
    result = watch(tmp_path, "--interval", "0.1")
    assert result.exit_code == 0 and "watch stopped: SIGTERM received" in result.output, result.output


def test_a_deleted_checkpoint_keeps_its_figures_by_the_hash_the_series_recorded(tmp_path, scripted):
    train, spec = recorded_series(tmp_path)
    assert watch(tmp_path).exit_code == 0
    shutil.rmtree(train / "checkpoint-10")  # save_total_limit, after its run finished
    assert gate(spec.series_dir, "10").exit_code == 0
    CliRunner().invoke(app, ["report", str(spec.series_dir)])
    points = {p["name"]: p for p in json.loads((spec.series_dir / "series.json").read_text())["points"]}
    assert points["checkpoint-10"]["status"] == "finished" and points["checkpoint-10"]["asr"] is not None

    state_file = spec.series_dir / "series.state.json"
    state = json.loads(state_file.read_text())
    state["checkpoints"]["checkpoint-10"]["model_hash"] = "sha256:" + "0" * 64  # other weights than its run's
    state_file.write_text(json.dumps(state))
    refused = gate(spec.series_dir, "10")
    assert refused.exit_code == 3 and "the series recorded sha256:000" in refused.output, refused.output
    CliRunner().invoke(app, ["report", str(spec.series_dir)])
    points = {p["name"]: p for p in json.loads((spec.series_dir / "series.json").read_text())["points"]}
    assert points["checkpoint-10"]["status"] == "unverified" and points["checkpoint-20"]["status"] == "finished"
