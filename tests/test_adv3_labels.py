"""Adversarial review (round 3), labels and policy: `validate --format run` weighs `label --next`'s labels only by
the order drawn from this run (D7), and a release policy's switches are booleans only (D8)."""

from __future__ import annotations

import json

import pytest
from test_adversarial import cli
from test_review import make_run

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.review.labels import LabelStore
from diagsafe_local.review.next_label import as_sample, order_for
from diagsafe_local.runs.policy import read_policy
from diagsafe_local.runs.records import read_results


def _damage_other_run(data: dict) -> None:
    data["run_id"] = "0123456789abcdef"


def _damage_truncated(data: dict) -> None:
    data["entries"] = data["entries"][:5]  # its 5 labelled entries alone would count as a census (inclusion 1)


def _damage_weight(data: dict) -> None:
    data["entries"][1]["weight"] *= 4  # a smaller inverse-probability weight for a label given


DAMAGES = {
    "other-run": (_damage_other_run, "run_id"),
    "truncated": (_damage_truncated, "entries"),
    "weight": (_damage_weight, "entries[1].weight"),
}


@pytest.fixture(scope="module")
def labelled_next(tmp_path_factory):
    """A run with 5 labels given in `label --next`'s order; the order file's text as drawn."""
    tmp_path = tmp_path_factory.mktemp("next")
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = make_run(tmp_path, monkeypatch)
    run_id = json.loads((run / "manifest.json").read_text())["run_id"]
    order = order_for(run, read_results(run / "results.jsonl"), run_id, None)
    sample, store = as_sample(order), LabelStore(run, "ann", run_id)
    for k in range(5):
        store.give(sample.entries[k], "harmful" if order.entries[k].score > 0.5 else "not_harmful")
    return run, (run / "labels" / "next.json").read_text()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_validate_refuses_a_label_order_that_is_not_this_runs(labelled_next, tmp_path, damage):
    run, drawn = labelled_next
    edit, field = DAMAGES[damage]
    data = json.loads(drawn)
    edit(data)
    (run / "labels" / "next.json").write_text(json.dumps(data))
    result = cli("validate", "--gold", run, "--format", "run", "--out", tmp_path / "val")
    assert result.exit_code == 3, result.output
    assert "next.json" in result.text and f"'{field}'" in result.text, result.output  # type: ignore[attr-defined]
    assert not (tmp_path / "val").exists()


@pytest.mark.parametrize("switch", ["allow_degenerate_judge", "corrected"])
@pytest.mark.parametrize("value", ["1", "0"])
def test_a_policy_switch_given_as_a_number_is_refused(tmp_path, switch, value):
    path = tmp_path / "release.yaml"
    path.write_text(f"entries:\n- name: a\n  tier: critical\n  run: r\n  limits: {{max_asr: 0.1, {switch}: {value}}}\n")
    with pytest.raises(DiagsafeError, match=switch):
        read_policy(path)


@pytest.mark.parametrize("switch", ["allow_degenerate_judge", "corrected"])
def test_a_policy_switch_given_as_a_boolean_is_read(tmp_path, switch):
    path = tmp_path / "release.yaml"
    path.write_text(f"entries:\n- name: a\n  tier: critical\n  run: r\n  limits: {{max_asr: 0.1, {switch}: true}}\n")
    assert getattr(read_policy(path)[0].entries[0].limits, switch) is True


@pytest.mark.parametrize("switch", ["allow_degenerate_judge", "corrected"])
def test_a_run_configs_gate_switch_given_as_a_number_is_refused(tmp_path, switch):
    from diagsafe_local.evaluation.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        f"dataset: {{path: items.jsonl}}\ntarget: {{model: t}}\njudge: {{model: j}}\ngate: {{{switch}: 1}}\n"
    )
    with pytest.raises(DiagsafeError, match=f"gate.{switch}"):
        load_config(path)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_label_next_refuses_a_label_order_that_is_not_this_runs(labelled_next, monkeypatch, damage):
    """`label --next` checks the order file it reuses as `validate` does: an edited order is not labelled on."""
    import diagsafe_local.commands.review as command

    run, drawn = labelled_next
    edit, field = DAMAGES[damage]
    data = json.loads(drawn)
    edit(data)
    (run / "labels" / "next.json").write_text(json.dumps(data))
    served: list[object] = []
    monkeypatch.setattr(command, "_serve", lambda review, *args: served.append(review))
    result = cli("label", run, "--annotator", "ann", "--next", "--max-asr", "0.2")
    assert result.exit_code == 3, result.output
    text = " ".join(result.text.split())  # type: ignore[attr-defined]
    assert "next.json" in text and f"'{field}'" in text and "delete it to start over" in text, result.output
    assert not served and "Traceback" not in result.output
    (run / "labels" / "next.json").write_text(drawn)
    assert cli("label", run, "--annotator", "ann", "--next", "--max-asr", "0.2").exit_code == 0  # as drawn: used
    assert (run / "labels" / "next.json").read_text() == drawn
