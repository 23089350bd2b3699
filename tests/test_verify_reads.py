"""What `verify` holds a run to, at the edges the mutation figure (docs/benchmarks-log.md) found untested: the
missing answers it names are the ones missing, and a run's results read again after verification are refused
once they changed. Runs are made by the CLI with scripted engines (`finished_run`: 6 items, i0..i5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_adversarial import cli, config_file, finished_run, scripted, write_items

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.runs.verify import verify_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run for the module (each test edits a copy)."""
    mp = pytest.MonkeyPatch()
    try:
        return finished_run(tmp_path_factory.mktemp("verify-reads"), mp)
    finally:
        mp.undo()


def _copy(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def test_a_missing_result_is_named(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    results = run_dir / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    dropped = next(line for line in lines if b'"item_id":"i3"' in line.replace(b" ", b""))
    results.write_bytes(b"".join(line for line in lines if line is not dropped))
    problems = verify_run(run_dir).problems
    missing = next(p for p in problems if "judged answers are missing" in p)
    assert missing.startswith("1 of 6 judged answers are missing: t 1; e.g. t/i3 sample 0 turn "), missing


def test_results_read_again_after_verification_must_be_the_bytes_verified(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    run = verify_run(run_dir)
    assert run.ok and len(list(run.results())) == 6
    results = run_dir / "results.jsonl"
    results.write_bytes(results.read_bytes().replace(b'"score":1.0', b'"score":0.0', 1))
    with pytest.raises(RunFailed, match="changed after it was verified"):
        list(run.results())


def test_a_shard_verified_alone_is_not_whole(tmp_path, monkeypatch):
    """verify holds a run to the whole dataset unless told it is checking a shard for its own share."""
    scripted(monkeypatch)
    config = config_file(tmp_path, write_items(tmp_path / "items.jsonl", 6))
    assert cli("run", config, "--shard", "0/2").exit_code == 0
    [shard] = (tmp_path / "run" / "shards").iterdir()
    missing = [p for p in verify_run(shard).problems if "judged answers are missing" in p]
    assert len(missing) == 1 and "(this is shard 0 of 2)" in missing[0], missing
    assert verify_run(shard, whole=False).ok
