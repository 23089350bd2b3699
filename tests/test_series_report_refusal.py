"""`report SERIES` on a damaged series state is refused as the gate refuses it: exit 3 (cannot verify), one line
naming the file, never exit 2 (a bad command line) or a report of a state it could not read."""

from __future__ import annotations

import json

import pytest
from test_adversarial import cli
from test_series import recorded_series


def _field(path) -> None:
    state = json.loads(path.read_text())
    state["checkpoints"]["checkpoint-20"]["step"] = "twenty"
    path.write_text(json.dumps(state))


DAMAGE = {
    "a field edited": (_field, "checkpoints.checkpoint-20.step"),
    "bytes cut": (lambda path: path.write_bytes(path.read_bytes()[:40]), "corrupt series state"),
    "the state deleted": (lambda path: path.unlink(), "series.state.json is missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_report_of_a_damaged_series_state_exits_3(tmp_path, damage):
    _, spec = recorded_series(tmp_path)
    assert cli("report", spec.series_dir).exit_code == 0
    apply, said = DAMAGE[damage]
    apply(spec.series_dir / "series.state.json")
    refused = cli("report", spec.series_dir)
    assert refused.exit_code == 3 and said in refused.text, refused.output
    assert "Traceback" not in refused.output
