"""A merge killed with SIGKILL leaves its private stage (`.merging.XXXXXXXX`) in the output directory; the next
merge into that output removes it, and only it: only its own naming pattern, and only while it holds the output's
lock, which a live merge holds for as long as it writes there (`core.locking.DirectoryLock`, the lock `run`
takes too). The merge that is killed is a real process, paused once its stage holds the merged summary."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from test_adversarial import cli, finished_run

PAUSED = """
import sys, time
from pathlib import Path
from diagsafe_local.runs import merge

written = merge.write_summary
def write_and_wait(*args, **kwargs):
    summary = written(*args, **kwargs)
    print("staged", flush=True)
    time.sleep(600)
    return summary

merge.write_summary = write_and_wait
merge.merge_runs([Path(sys.argv[1]), Path(sys.argv[2])], Path(sys.argv[3]))
"""


@pytest.mark.slow
def test_a_merge_killed_mid_write_leaves_a_stage_the_next_merge_removes(tmp_path, monkeypatch):
    a = finished_run(tmp_path, monkeypatch, name="a")
    b = finished_run(tmp_path, monkeypatch, name="b", target={"model": "t", "name": "u"})
    out = tmp_path / "merged"
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(a), str(b), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "staged"
        [stage] = out.glob(".merging.*")
        assert (stage / "summary.json").is_file()
        busy = cli("merge", a, b, "--out", out)  # a live merge holds the output: refused, its stage untouched
        assert busy.exit_code == 2 and "being written by another diagsafe-local process" in busy.text, busy.output
        assert (stage / "summary.json").is_file()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert stage.is_dir() and not (out / "results.jsonl").exists()  # what SIGKILL leaves
    (out / ".merging-notes").mkdir()  # not the merge's own pattern: a user's
    (out / ".merging.abcdefgh").write_text("a file, not a stage")
    merged = cli("merge", a, b, "--out", out)
    assert merged.exit_code == 0, merged.output
    assert not stage.exists() and (out / ".merging-notes").is_dir() and (out / ".merging.abcdefgh").is_file()
    assert (out / "results.jsonl").is_file()
