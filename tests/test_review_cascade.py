"""The review page of a cascade run shows the verdict the gate decides on: the full judge's where the screen sent
an answer up (saying which judge gave it), the screen's elsewhere, and the screen's beside it where they differ;
its filters, sort and flips read the same verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_adv4_gate import EVERYTHING_UP
from test_adv4_gate import _run as cascade_run
from test_review import HOSTILE, browser  # noqa: F401 (a fixture)

from diagsafe_local.review.index import RunIndex


def _rows(index: RunIndex, **params: str) -> list[dict]:
    return index.query({"size": "200", **params})["rows"]


def _killed(run: Path, kept: int | None, torn: bool = False) -> list[dict]:
    """The run as a kill during its cascade leaves it: manifest 'running', cascade.jsonl's first `kept` lines (None:
    no file yet), then the first half of the next one where `torn`; returns the records kept."""
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    path = run / "cascade.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if kept is None:
        path.unlink()
        return []
    path.write_text("".join(lines[:kept]) + (lines[kept][: len(lines[kept]) // 2] if torn else ""))
    return [json.loads(line) for line in lines[:kept]]


def _edit_votes(run: Path, role: str, **vote: object) -> list[dict]:
    """cascade.jsonl with every vote of `role` given these fields (the page shows what the files say)."""
    path = run / "cascade.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        if record["role"] == role:
            record["vote"] |= vote
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [r for r in records if r["role"] == role]


def test_a_cascades_answers_show_the_verdict_the_gate_decides_on_and_which_judge_gave_it(tmp_path):
    """Band [0.4, 0.6]: the screen sends up its 8 'maybe' answers (0.5), which the full judge calls harmful; the 12
    'sly' answers it kept (0.0, harmful to the full judge) stay the screen's, audited or not. Harmful: 8 'bad' and
    the 8 'maybe' (16, the gate's 0.4 of 40), not the screen's 8."""
    index = RunIndex([cascade_run(tmp_path / "run", sly=12, cascade={"band": [0.4, 0.6]})])
    harmful = _rows(index, verdict="harmful")
    assert len(harmful) == 16, [(r["answer_head"], r["score"]) for r in harmful]
    maybe = [r for r in _rows(index) if "maybe" in r["answer_head"]]
    assert len(maybe) == 8
    assert {(r["score"], r["verdict"], r["judged_by"], r["screen_score"]) for r in maybe} == {
        (1.0, "harmful", "full judge", 0.5)
    }
    kept = [r for r in _rows(index) if "maybe" not in r["answer_head"]]
    assert {r["judged_by"] for r in kept} == {"screen"} and {r["screen_score"] for r in kept} == {None}
    assert {r["score"] for r in kept if "sly" in r["answer_head"]} == {0.0}  # an audit verdict decides nothing
    assert [r["item_id"] for r in _rows(index, sort="score", order="desc")][:16] == sorted(
        r["item_id"] for r in harmful
    )
    detail = index.record(maybe[0]["index"])
    assert detail["record"]["score"] == 0.5  # the screen's record, as written
    decided = detail["decided"]
    assert decided["judged_by"] == "full judge" and decided["score"] == 1.0
    assert decided["vote"]["rubric"] == "full" and decided["vote"]["verdict"]["label"] == "harmful"
    assert index.record(kept[0]["index"])["decided"] is None  # the screen's own verdict is the record's


def test_two_cascades_side_by_side_flip_on_the_cascades_verdicts(tmp_path):
    """Every answer goes up: the candidate's 12 'sly' answers are harmful to the full judge, the baseline's are
    not, while the screen called both sides' alike (no flip on its verdicts)."""
    base = cascade_run(tmp_path / "base", cascade=EVERYTHING_UP)
    candidate = cascade_run(tmp_path / "cand", sly=12, cascade=EVERYTHING_UP)
    flips = _rows(RunIndex([base, candidate]), flip="1")
    assert len(flips) == 24 and {r["run"] for r in flips} == {0, 1}, flips
    assert {r["verdict"] for r in flips if r["run"] == 1} == {"harmful"}
    assert {r["verdict"] for r in flips if r["run"] == 0} == {"not_harmful"}
    assert {r["judged_by"] for r in flips} == {"full judge"}


def test_labelling_reveals_the_verdict_the_gate_decides_on_after_the_label(tmp_path):
    """Labelling a 'maybe' answer sent up: nothing of a verdict before the label; after it, the screen's record
    and the full judge's verdict, the one the gate decides on."""
    from diagsafe_local.review.labels import LabelStore, sample_for
    from diagsafe_local.review.server import LabelSession
    from diagsafe_local.runs.records import read_results

    run = cascade_run(tmp_path / "run", cascade={"band": [0.4, 0.6]})
    sample = sample_for(run, read_results(run / "results.jsonl"), "r", 40)
    index = RunIndex([run])
    session = LabelSession(index, sample, LabelStore(run, "ann", "r"))
    k = next(k for k in range(len(sample.entries)) if "maybe" in session.entry(k)["answer"])
    assert "decided" not in session.entry(k) and "score" not in session.entry(k)  # no anchoring
    shown = session.give(k, "harmful")
    assert shown["score"] == 0.5 and shown["decided"]["judged_by"] == "full judge"
    assert shown["decided"]["score"] == 1.0 and shown["decided"]["vote"]["verdict"]["label"] == "harmful"


def test_a_killed_cascade_with_a_torn_last_line_is_browsed_with_a_note(tmp_path):
    """Killed while its full judge wrote: cascade.jsonl ends in a torn line. The page opens (it decides nothing),
    ignores the torn tail and says so; the answers sent up that have a verdict show it, the others are sent up and
    not judged yet, with no score claimed (not 'full judge 1.00')."""
    run = cascade_run(tmp_path / "run", cascade={"band": [0.4, 0.6]})
    kept = _killed(run, kept=3, torn=True)
    index = RunIndex([run])
    assert len(index.notes) == 1 and "cascade.jsonl line 4" in index.notes[0] and "torn" in index.notes[0]
    maybe = [r for r in _rows(index) if "maybe" in r["answer_head"]]
    judged = {(r["target"], r["item_id"], r["sample"], r["turn"]) for r in kept if r["role"] == "band"}
    assert 0 < len(judged) < 8  # some answers sent up judged before the kill, some not
    full = [r for r in maybe if (r["target"], r["item_id"], r["sample"], r["turn"]) in judged]
    assert len(full) == len(judged) and {(r["judged_by"], r["score"]) for r in full} == {("full judge", 1.0)}
    waiting = [r for r in maybe if r not in full]
    assert len(waiting) == 8 - len(judged)
    assert {(r["judged_by"], r["score"], r["verdict"], r["screen_score"]) for r in waiting} == {
        ("sent up, not judged yet", None, "unscored", 0.5)
    }
    assert index.record(waiting[0]["index"])["decided"] == {
        "judged_by": "sent up, not judged yet", "score": None, "vote": None, "gave_no_verdict": False
    }  # fmt: skip


def test_a_killed_cascade_with_no_cascade_jsonl_yet_claims_no_full_judge_verdict(tmp_path):
    """Killed before its full judge wrote anything: every answer sent up is 'sent up, not judged yet', unscored
    (not harmful by a verdict nobody gave): harmful are the 8 'bad' answers the screen judged, no more."""
    run = cascade_run(tmp_path / "run", cascade={"band": [0.4, 0.6]})
    _killed(run, kept=None)
    index = RunIndex([run])
    assert index.notes == [
        f"{run / 'cascade.jsonl'}: not written yet (the run is not complete): no answer sent up is judged"
    ]
    maybe = [r for r in _rows(index) if "maybe" in r["answer_head"]]
    assert {(r["judged_by"], r["score"], r["verdict"]) for r in maybe} == {
        ("sent up, not judged yet", None, "unscored")
    }
    assert len(_rows(index, verdict="harmful")) == 8


def test_only_a_torn_last_line_is_left_out(tmp_path):
    """results.jsonl cut inside its last line: 39 answers and a note; a bad line before the last is still an error
    naming it (a torn line is only ever the last)."""
    from diagsafe_local.core.errors import DataError

    run = cascade_run(tmp_path / "run", cascade=None)
    path = run / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:40])
    index = RunIndex([run])
    assert len(index.rows) == 39 and index.notes == [
        f"{path} line 40: torn (the run was stopped while writing it), not shown"
    ]
    path.write_text("".join(lines[:-2]) + lines[-2][:40] + "\n" + lines[-1])
    with pytest.raises(DataError, match="results.jsonl line 39"):
        RunIndex([run])


@pytest.mark.parametrize("status", ["invalid", "error"])
def test_a_full_judge_vote_with_no_verdict_is_said_to_count_harmful(tmp_path, status):
    """A complete cascade whose full judge gave no verdict on the answers sent up (an invalid reply, an engine
    error): the gate counts each harmful (1.00), and the detail says why, as for a missing record."""
    run = cascade_run(tmp_path / "run", cascade={"band": [0.4, 0.6]})
    _edit_votes(run, "band", parse_status=status, score=None, verdict=None)
    index = RunIndex([run])
    assert index.notes == []
    maybe = [r for r in _rows(index) if "maybe" in r["answer_head"]]
    assert {(r["judged_by"], r["score"]) for r in maybe} == {("full judge", 1.0)}
    decided = index.record(maybe[0]["index"])["decided"]
    assert decided["gave_no_verdict"] and decided["vote"]["parse_status"] == status
    kept = next(r for r in _rows(index) if r["judged_by"] == "screen")
    assert index.record(kept["index"])["decided"] is None


@pytest.mark.slow  # the shared browser and a server: about 3 s
def test_the_page_shows_the_full_judges_verdict_beside_the_screens_as_text(browser, tmp_path):  # noqa: F811
    """A 'maybe' answer sent up: its list row says 'full judge' with the screen's 0.50 beside it, and its detail
    gives the full judge's verdict first, its rationale hostile text shown as text (cascade.jsonl edited: the page
    reads what the files say), then the screen's."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from diagsafe_local.review.server import Review, ReviewServer

    run = cascade_run(tmp_path / "run", sly=12, cascade={"band": [0.4, 0.6]})
    path = run / "cascade.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        if record["vote"]["verdict"]:
            record["vote"]["verdict"]["rationale"] = HOSTILE
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    server = ReviewServer(Review(RunIndex([run]))).start()
    try:
        browser.get(server.url)
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("40 of 40"))
        browser.find_element(By.NAME, "q").send_keys("maybe")
        Select(browser.find_element(By.NAME, "verdict")).select_by_value("harmful")
        wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("8 of 40"))
        row = browser.find_elements(By.CSS_SELECTOR, "#rows li")[0]
        assert "full judge" in row.text and "screen 0.50" in row.text, row.text
        row.click()
        wait.until(lambda d: d.find_element(By.ID, "detail").is_displayed())
        shown = browser.find_element(By.CSS_SELECTOR, "#detail dl.verdict").text
        assert shown.index("full judge: 1.00") < shown.index(HOSTILE) < shown.index("screen, not decided on"), shown
        assert browser.execute_script("return window.pwned === undefined")
        assert not browser.find_elements(By.CSS_SELECTOR, "#detail img, #detail script, #detail textarea")
    finally:
        server.stop()


@pytest.mark.slow  # the shared browser and two servers: about 4 s
def test_the_page_says_what_the_full_judge_did_not_judge(browser, tmp_path):  # noqa: F811
    """A killed cascade (torn cascade.jsonl): the page says the tail was ignored; an answer sent up and not judged
    yet shows no score. A complete one whose full judge's reply was invalid: 'full judge: 1.00' with the note that
    it gave no verdict and counts harmful."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from diagsafe_local.review.server import Review, ReviewServer

    killed = cascade_run(tmp_path / "killed", cascade={"band": [0.4, 0.6]})
    _killed(killed, kept=0, torn=True)
    invalid = cascade_run(tmp_path / "invalid", cascade={"band": [0.4, 0.6]})
    _edit_votes(invalid, "band", parse_status="invalid", score=None, verdict=None)
    for run, row_text, detail_text in (
        (killed, "sent up, not judged yet", "sent up, not judged yet"),
        (invalid, "full judge", "full judge: 1.00 (it gave no verdict: counts harmful)"),
    ):
        server = ReviewServer(Review(RunIndex([run]))).start()
        try:
            browser.get(server.url)
            wait = WebDriverWait(browser, 20)
            wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("40 of 40"))
            notes = browser.find_element(By.ID, "notes")
            assert ("torn" in notes.text) == (run == killed), notes.text
            browser.find_element(By.NAME, "q").send_keys("maybe")
            wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("8 of 40"))
            row = browser.find_elements(By.CSS_SELECTOR, "#rows li")[0]
            assert row_text in row.text and ("no score" in row.text) == (run == killed), row.text
            row.click()
            wait.until(lambda d: d.find_element(By.ID, "detail").is_displayed())
            shown = browser.find_element(By.CSS_SELECTOR, "#detail dl.verdict").text
            assert detail_text in shown and ("1.00" in shown.split("screen, not decided on")[0]) == (run == invalid)
        finally:
            server.stop()
