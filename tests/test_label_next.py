"""`label --next`: the order (the likeliest-wrong verdicts first), inclusion probabilities that keep the
Horvitz-Thompson estimate unbiased wherever the annotator stops, the settled line after each label (session and
page API), and `validate --format run` weighting the labels of the order as they came."""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_review
from test_adversarial import cli
from test_review import get, make_run

from diagsafe_local.review.next_label import NextOrder, draw_order, error_chance, inclusion, standing
from diagsafe_local.runs.records import PanelVote, ResultRecord
from diagsafe_local.runs.validation import JudgeErrorRates

browser = test_review.browser  # the page's test drives test_review's Chromium fixture


def answer(k: int, score: float, p_yes: float | None = None, votes: list[float] | None = None) -> ResultRecord:
    """A final answer to a harmful item, with only the fields the order reads."""
    panel = [PanelVote(rubric=f"m{j}", raw="", verdict={}, score=v, parse_status="ok") for j, v in enumerate(votes)] if votes else None  # fmt: skip
    return ResultRecord.model_construct(
        target="t", item_id=f"i{k:03d}", sample=0, turn=1, benign=False, final_turn=True, answer=f"a{k}",
        score=score, verdict=None if p_yes is None else {"p_yes": p_yes}, panel=panel,
    )  # fmt: skip


def test_the_chance_a_verdict_is_wrong_from_the_jury_p_harmful_or_validated_rates():
    assert error_chance(answer(0, 1.0, votes=[1.0, 1.0, 0.0]), None) == pytest.approx(1 / 3)  # one juror against
    assert error_chance(answer(1, 0.0, p_yes=0.45), None) == pytest.approx(0.45)
    assert error_chance(answer(2, 1.0, p_yes=0.97), None) == pytest.approx(0.03)
    rates = JudgeErrorRates(judge="j", tp=8, fp=2, tn=85, fn=5)
    assert error_chance(answer(3, 1.0), rates) == pytest.approx(0.2)  # false discoveries among harmful verdicts
    assert error_chance(answer(4, 0.0), rates) == pytest.approx(5 / 90)  # false omissions among the rest
    assert error_chance(answer(5, 0.0), None) == 0.5  # nothing known: every answer alike


def test_the_order_shows_the_likeliest_wrong_verdicts_first():
    sure = [answer(k, float(k % 2), p_yes=0.02 if k % 2 == 0 else 0.98) for k in range(50)]
    split = [answer(100 + k, 0.0, p_yes=0.45) for k in range(10)]
    positions = []
    for seed in range(20):
        order = draw_order(sure + split, "r", seed=seed)
        positions += [k for k, e in enumerate(order.entries) if e.item_id >= "i100"]
    assert np.mean(positions) < 15  # uniform positions would average 29.5


def test_inclusion_probabilities_keep_the_estimate_unbiased_wherever_the_annotator_stops():
    rng = np.random.default_rng(7)
    p_yes = rng.beta(0.6, 0.6, 80)
    records = [answer(k, float(p > 0.5), p_yes=float(p)) for k, p in enumerate(p_yes)]
    truth = {r.key: float(rng.random() < p) for r, p in zip(records, p_yes)}
    for k in (5, 20):
        estimates = []
        for seed in range(400):
            order = draw_order(records, "r", seed=seed)
            counted = inclusion(order, [e.key for e in order.entries[:k]])
            assert len(counted) == k
            estimates.append(sum(truth[key] / p for key, p in counted.items()))
        spread = np.std(estimates) / np.sqrt(len(estimates))
        assert abs(np.mean(estimates) - sum(truth.values())) < 4 * spread  # Horvitz-Thompson: unbiased
    order = draw_order(records, "r", seed=0)
    gap = [e.key for e in order.entries[:3]] + [order.entries[4].key]  # the fourth left unlabelled
    assert set(inclusion(order, gap)) == set(gap[:3])  # a label past a gap waits for the gap


def test_weighted_labels_count_as_a_sample_as_informative_as_their_design():
    from diagsafe_local.validation.agreement import effective_counts

    y, pred = np.array([0] * 10 + [1] * 10), np.array([0] * 8 + [1] * 2 + [1] * 9 + [0])
    assert effective_counts(y, pred, np.full(20, 7.0)) == pytest.approx((8, 2, 1, 9))  # equal weights: the counts
    # the errors among the heavily sampled answers (small weights), the sure ones weighted up: the shares are the
    # weighted ones, over a size from their design variance (not the number of items, not Kish's)
    w = np.array([40.0] * 8 + [2.0] * 2 + [40.0] * 9 + [2.0])
    tn, fp, fn, tp = effective_counts(y, pred, w)
    assert fp / (fp + tn) == pytest.approx(4 / 324) and fn / (fn + tp) == pytest.approx(2 / 362)
    share = 4 / 324
    variance = (8 * 40**2 * share**2 + 2 * 2**2 * (1 - share) ** 2) / 324**2
    assert fp + tn == pytest.approx(share * (1 - share) / variance)


def test_the_decision_settles_as_labels_come_and_an_unsure_label_never_settles_it():
    records = [answer(k, float(k < 30), p_yes=0.9 if k < 30 else 0.1) for k in range(200)]
    order = draw_order(records, "r", seed=1)
    truth = {e.key: "harmful" if e.score > 0.5 else "not_harmful" for e in order.entries}  # the judge is right
    given: dict = {}
    lines = []
    for entry in order.entries:
        given[entry.key] = truth[entry.key]
        now = standing(order, given, limit=0.3)
        lines.append(now.line())
        if now.settled:
            break
    assert now.settled == "pass" and now.high is not None and now.high <= 0.3 and len(given) < len(order.entries)
    assert lines[0].startswith("not settled")
    unsure = standing(order, {**given, **{k: "unsure" for k in list(given)[:10]}}, limit=0.3)
    assert unsure.settled is None or (unsure.high or 1) > (now.high or 0)  # unsure counts as the judge wrong
    assert now.low is not None and standing(order, given, limit=(now.low + now.high) / 2).settled is None  # inside


@pytest.mark.slow  # a run, a server and validate: ~3 s on a quiet machine, 13 under load
def test_label_next_session_says_where_the_decision_stands_and_validate_weights_the_prefix(tmp_path, monkeypatch):
    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.labels import LabelStore
    from diagsafe_local.review.next_label import as_sample, order_for
    from diagsafe_local.review.server import LabelSession, Review, ReviewServer
    from diagsafe_local.runs.records import read_results

    run = make_run(tmp_path, monkeypatch)
    run_id = json.loads((run / "manifest.json").read_text())["run_id"]
    order = order_for(run, read_results(run / "results.jsonl"), run_id, None)
    assert order_for(run, read_results(run / "results.jsonl"), run_id, None) == order  # drawn once, shared
    index = RunIndex([run])
    said: list[str] = []
    session = LabelSession(
        index,
        as_sample(order),
        LabelStore(run, "ann", run_id),
        lambda labels: standing(order, labels, 0.5),
        said.append,
    )
    review = Review(index, session)
    server = ReviewServer(review).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        state = json.loads(get(base, review.token, "/api/sample")[2])
        assert state["standing"].startswith("not settled")
        for k in (0, 1, 2, 4):  # the fourth answer of the order skipped
            word = "harmful" if order.entries[k].score > 0.5 else "not_harmful"
            reply = json.loads(get(base, review.token, "/api/label", "POST", {"index": k, "label": word})[2])
            assert reply["standing"] == said[-1]
        assert said[-1].endswith("3 of 4 labels counted")  # the label past the gap waits
    finally:
        server.stop()
    labels = [json.loads(line) for line in (run / "labels" / "ann.jsonl").read_text().splitlines()]
    assert {x["design"] for x in labels} == {"next"}
    result = cli("validate", "--gold", run, "--format", "run", "--out", tmp_path / "val")
    assert result.exit_code == 0, result.output
    validation = json.loads((tmp_path / "val" / "validation.json").read_text())
    assert validation["n_labelled"] == 3  # the prefix, weighted by its inclusion probabilities as of now
    expected = inclusion(NextOrder.model_validate_json((run / "labels" / "next.json").read_text()),
                         [order.entries[k].key for k in (0, 1, 2, 4)])  # fmt: skip
    assert len(expected) == 3 and all(p < 1 for p in expected.values())
    assert "past an answer left unlabelled" in result.output


def test_label_next_on_the_command_line_prints_where_the_decision_stands(tmp_path, monkeypatch):
    import diagsafe_local.commands.review as command

    run = make_run(tmp_path, monkeypatch)
    served = []
    monkeypatch.setattr(command, "_serve", lambda review, *args: served.append(review))
    result = cli("label", run, "--annotator", "ann", "--next", "--max-asr", "0.2")
    assert result.exit_code == 0, result.output
    assert "40 answers in the order of what a label tells; not settled" in result.output
    [review] = served
    assert [e.design for e in review.session.sample.entries] == ["next"] * 40
    alone = cli("label", run, "--annotator", "ann", "--next")
    assert alone.exit_code == 2 and "--max-asr" in alone.output and "Traceback" not in alone.output


@pytest.mark.slow
def test_the_labelling_page_shows_where_the_decision_stands(browser, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.labels import LabelStore
    from diagsafe_local.review.next_label import as_sample, order_for
    from diagsafe_local.review.server import LabelSession, Review, ReviewServer
    from diagsafe_local.runs.records import read_results

    run = make_run(tmp_path, monkeypatch)
    order = order_for(run, read_results(run / "results.jsonl"), "r", None)
    index = RunIndex([run])
    session = LabelSession(index, as_sample(order), LabelStore(run, "ann", "r"), lambda x: standing(order, x, 0.5))
    server = ReviewServer(Review(index, session)).start()
    try:
        browser.get(server.url)
        wait = WebDriverWait(browser, 20)
        shown = lambda d: d.find_element(By.ID, "standing").text  # noqa: E731
        wait.until(lambda d: shown(d).startswith("not settled") and "0 of 0 labels counted" in shown(d))
        browser.find_element(By.TAG_NAME, "body").send_keys("hn")
        wait.until(lambda d: "2 of 2 labels counted" in shown(d))
    finally:
        server.stop()
