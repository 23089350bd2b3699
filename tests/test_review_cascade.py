"""The review page of a cascade run shows the verdict the gate decides on: the full judge's where the screen sent
an answer up (saying which judge gave it), the screen's elsewhere, and the screen's beside it where they differ;
its filters, sort and flips read the same verdicts."""

from __future__ import annotations

import json

import pytest
from test_adv4_gate import EVERYTHING_UP
from test_adv4_gate import _run as cascade_run
from test_review import HOSTILE, browser  # noqa: F401 (a fixture)

from diagsafe_local.review.index import RunIndex


def _rows(index: RunIndex, **params: str) -> list[dict]:
    return index.query({"size": "200", **params})["rows"]


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
