"""merge --allow-different-judges writes the merged run as asked, and says what it is: runs of different judges,
which the gate refuses (exit 3) as such, never as an edited record; the report's banner says the same."""

from __future__ import annotations

from test_adversarial import cli, finished_run


def test_a_merge_of_different_judges_says_the_gate_refuses_it_for_its_mix_of_judges(tmp_path, monkeypatch):
    a = finished_run(tmp_path, monkeypatch, n=4, name="a")
    metric = {"metric": "gcg_keywords", "threshold": 0.5, "benign_rubric": "refusal-keywords"}
    b = finished_run(tmp_path, monkeypatch, n=4, name="b", target={"model": "t", "name": "u"}, judge=metric)
    merged = cli("merge", a, b, "--out", tmp_path / "m", "--allow-different-judges")
    assert merged.exit_code == 0, merged.output  # the merge asked for is done, and said for what it is
    assert "the run does not verify (the gate would refuse it)" in merged.text, merged.output
    assert "merge --allow-different-judges" in merged.text and "(the record was edited)" not in merged.text, (
        merged.output
    )
    banner = (tmp_path / "m" / "report.md").read_text().split("\n\n")[1]
    assert "NOT VERIFIED" in banner and "different judges" in banner and "(the record was edited)" not in banner, banner
    refused = cli("gate", tmp_path / "m", "--max-asr", "1", "--allow-degenerate-judge")
    assert refused.exit_code == 3 and "judge_rubric is 'gcg_keywords>=0.5'" in refused.text, refused.output
    assert "different judges" in refused.text and "(the record was edited)" not in refused.text, refused.output
