"""A run directory's judging-pass stores come from the pass table (`runs.passes.PASSES`): a new pass's row opens
its store, resumes it and wipes it on --overwrite, with no line in `evaluation.run_directory`. Fast: no engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_adversarial import config_file, write_items
from test_pass_table import ECHO, ECHO_PASS, EchoRecord

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.evaluation.config import load_config
from diagsafe_local.evaluation.run_directory import RunDirectory
from diagsafe_local.runs import passes
from diagsafe_local.runs.records import JuryVote


def _directory(tmp_path: Path, overwrite: bool = False) -> RunDirectory:
    config = load_config(config_file(tmp_path, write_items(tmp_path / "items.jsonl", 1)))
    return RunDirectory(config, tmp_path / "run", overwrite).open()


def test_each_passs_store_comes_from_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passes, "PASSES", (*passes.PASSES, ECHO_PASS))
    directory = _directory(tmp_path)
    try:
        for row in passes.PASSES:  # every row's store, on its file, of its record
            store = directory.store(row.record)
            assert (store.path, store.model) == (directory.root / row.file, row.record)
        directory.store(EchoRecord).append([EchoRecord(run_id="r", target="t", item_id="i0", score=None)])
        assert directory.store(JuryVote).path.name == "jury.jsonl"
    finally:
        directory.close()
    with pytest.raises(DiagsafeError, match="run files without a manifest"):  # the pass's file is a run file
        _directory(tmp_path)
    _directory(tmp_path, overwrite=True).close()  # --overwrite removes every file the tool writes, the pass's too
    assert not (tmp_path / "run" / ECHO).exists()
