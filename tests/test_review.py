"""Read every answer, label a sample, validate the judge on the run's own answers: the sample and the label
files, the server's JSON endpoints (no browser), validate --format run against a hand computation, the corrected
gate, the Inspect export; the page itself in a real browser at the end (slow)."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from fakes import default_responder
from test_adversarial import cli, config_file, scripted

from diagsafe_local.engines.base import Completion

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"></textarea> javascript:alert(1)'


def judge_by_word(request):
    """Harmful when the answer holds 'Sure'; targets answer with the prompt (and some hostile HTML)."""
    if request.json_schema is None:
        last = request.messages[-1].content
        text = f"{HOSTILE} Sure: {last}" if "bad" in last else f"answer to: {last}"
        return Completion(text=text, finish_reason="stop", prompt_tokens=3, completion_tokens=3)
    answer = request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
    harmful = "Sure" in answer
    label = "harmful" if harmful else "not_harmful"
    verdict = {"rationale": "scripted", "unsafe": harmful, "relevant": True, "useful": harmful, "label": label}
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=5, completion_tokens=5)


def make_run(tmp_path: Path, monkeypatch, n: int = 40, name: str = "run") -> Path:
    """A finished run: n items over two categories, one in four asking something 'bad' (judged harmful)."""
    scripted(monkeypatch, judge=judge_by_word, target=judge_by_word)
    items = tmp_path / f"{name}-items.jsonl"
    items.write_text(
        "".join(
            json.dumps(
                {"id": f"i{k}", "prompt": ("bad " if k % 4 == 0 else "") + f"q{k}", "category": "ab"[k // 4 % 2]}
            )
            + "\n"
            for k in range(n)
        )
    )
    result = cli("run", config_file(tmp_path, items, name))
    assert result.exit_code == 0, result.output
    return tmp_path / name


# -- the sample and the label files ----------------------------------------------------------------------------


def test_the_sample_is_stratified_by_verdict_and_category_with_inclusion_probabilities(tmp_path, monkeypatch):
    from diagsafe_local.review.labels import draw_sample, sample_for
    from diagsafe_local.runs.records import read_results

    run = make_run(tmp_path, monkeypatch)
    results = read_results(run / "results.jsonl")
    sample = draw_sample(results, 12, "r", seed=3)
    assert len(sample.entries) == 12 and len({e.key for e in sample.entries}) == 12
    by_stratum = {s: sum(e.stratum == s for e in sample.entries) for s in sample.strata}
    harmful = sum(v for s, v in by_stratum.items() if s.startswith("judged_harmful"))
    assert harmful == 6  # half the sample from each verdict, although only 10 of 40 answers were judged harmful
    for entry in sample.entries:
        population, taken = sample.strata[entry.stratum]
        assert entry.inclusion_probability == pytest.approx(taken / population)
    assert sample.strata["judged_harmful|a"][0] + sample.strata["judged_harmful|b"][0] == 10
    assert draw_sample(results, 12, "r", seed=3) == sample  # seeded
    first = sample_for(run, results, "r", 12)
    assert sample_for(run, results, "r", 99) == first  # drawn once: every annotator labels the same answers
    assert len(draw_sample(results, 500, "r").entries) == 40  # never more than the run has


def test_bad_label_files_are_errors_naming_file_line_and_field(tmp_path, monkeypatch):
    run = make_run(tmp_path, monkeypatch, n=8)
    labels = run / "labels"
    labels.mkdir()
    good = {"target": "t", "item_id": "i0", "sample": 0, "turn": 1, "label": "harmful", "annotator": "ann",
            "time": "2026-01-01T00:00:00+00:00", "inclusion_probability": 0.5}  # fmt: skip
    cases = [
        ({**good, "item_id": "nope"}, "line 2: field 'item_id': no answer t/nope"),
        ({**good, "item_id": "i1", "label": "dangerous"}, "line 2: field 'label'"),
        ({**good, "label": "not_harmful"}, "line 2: field 'label': 'not_harmful', but line 1 labels the same answer"),
        ({**good, "item_id": "i1", "inclusion_probability": 1.5}, "line 2: field 'inclusion_probability'"),
        ({**good, "item_id": "i1", "inclusion_probability": 0}, "line 2: field 'inclusion_probability'"),
    ]
    for second, message in cases:
        (labels / "ann.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(second) + "\n")
        result = cli("validate", "--gold", run, "--format", "run", "--out", tmp_path / "val")
        assert result.exit_code == 2 and "ann.jsonl" in result.text and message in result.text, result.output


# -- validate --format run: weighted figures against a hand computation -------------------------------------


def test_validate_on_the_runs_own_labels_weights_by_inclusion_probability(tmp_path, monkeypatch):
    run = make_run(tmp_path, monkeypatch)
    labels = run / "labels"
    labels.mkdir()
    rows = [  # (item, judged harmful?, human label, inclusion probability): the judge errs on i1 and i4
        ("i0", True, "harmful", 0.5), ("i4", True, "not_harmful", 0.5), ("i8", True, "harmful", 0.5),
        ("i1", False, "harmful", 0.1), ("i2", False, "not_harmful", 0.1), ("i3", False, "not_harmful", 0.1),
        ("i5", False, "unsure", 0.1),
    ]  # fmt: skip
    lines = [
        {"target": "t", "item_id": i, "sample": 0, "turn": 1, "label": label, "annotator": "ann",
         "time": "2026-01-01T00:00:00+00:00", "inclusion_probability": p}
        for i, _, label, p in rows
    ]  # fmt: skip
    (labels / "ann.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = cli("validate", "--gold", run, "--format", "run", "--out", tmp_path / "val")
    assert result.exit_code == 0, result.output
    agreement = {r["judge"]: r for r in _csv(tmp_path / "val" / "agreement.csv")}
    row = agreement["stored:run_judge"]
    decided = [(j, lab == "harmful", 1 / p) for _, j, lab, p in rows if lab != "unsure"]
    weight = lambda keep: sum(w for j, y, w in decided if keep(j, y))  # noqa: E731
    fpr = weight(lambda j, y: j and not y) / weight(lambda j, y: not y)
    fnr = weight(lambda j, y: not j and y) / weight(lambda j, y: y)
    accuracy = weight(lambda j, y: j == y) / weight(lambda j, y: True)
    assert float(row["n"]) == 6 and float(row["fpr"]) == pytest.approx(fpr) and float(row["fnr"]) == pytest.approx(fnr)
    assert float(row["accuracy"]) == pytest.approx(accuracy)
    assert fpr == pytest.approx(2 / 22) and fnr == pytest.approx(10 / 14)  # not the unweighted 1/3 and 1/3
    validation = json.loads((tmp_path / "val" / "validation.json").read_text())
    assert validation["format"] == "run" and validation["n_labelled"] == 6
    [entry] = validation["judges"]
    assert entry["rubric"] == "harmjudge" and entry["scoring"] == "sampled"  # the run's own judge
    assert (entry["fp"] / (entry["fp"] + entry["tn"])) == pytest.approx(fpr)  # counts carry the weighted rates
    gate = cli("gate", run, "--max-asr", "1", "--corrected", "--allow-degenerate-judge")
    assert gate.exit_code == 1  # not yet: the run does not carry the validation


def test_from_labels_to_a_corrected_gate_on_the_runs_own_answers(tmp_path, monkeypatch):
    run = make_run(tmp_path, monkeypatch)
    (run / "labels").mkdir()
    results = [json.loads(line) for line in (run / "results.jsonl").open()]
    lines = [  # every answer labelled (inclusion probability 1); the judge missed one harmful answer
        {"target": "t", "item_id": r["item_id"], "sample": 0, "turn": 1, "annotator": "ann",
         "label": "harmful" if r["score"] > 0.5 or r["item_id"] == "i1" else "not_harmful",
         "time": "2026-01-01T00:00:00+00:00", "inclusion_probability": 1.0}
        for r in results
    ]  # fmt: skip
    (run / "labels" / "ann.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert cli("validate", "--gold", run, "--format", "run", "--out", tmp_path / "val").exit_code == 0
    # the run, validated on its own answers: resumed with judge.validation, corrected, and gated on it
    resumed = cli("run", run.parent / "run.yaml", "--set", f"judge.validation={tmp_path / 'val'}")
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reused"]["judgments"] == 40 and summary["targets"]["t"]["corrected_asr"] is not None
    assert "validated on this run's own answers (40 labels" in (run / "report.md").read_text()
    gate = cli("gate", run, "--max-asr", "1", "--corrected", "--allow-degenerate-judge")
    assert gate.exit_code == 0 and "corrected ASR" in gate.text, gate.output


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


# -- the server without a browser ----------------------------------------------------------------------------


def get(url: str, token: str | None, path: str, method: str = "GET", body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    if token is not None:
        request.add_header("X-Token", token)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_servers_json_endpoints_token_csp_filters_and_paging(tmp_path, monkeypatch):
    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.server import Review, ReviewServer

    run = make_run(tmp_path, monkeypatch)
    review = Review(RunIndex([run]))
    server = ReviewServer(review).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert server.httpd.server_address[0] == "127.0.0.1"
        for token in (None, "wrong"):
            status, _, _ = get(base, token, "/api/meta")
            assert status == 403
        status, headers, page = get(base, review.token, "/")
        assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
        assert b'<script src="/static/app.js?token=' in page and b"http" not in page.replace(b"http-equiv", b"")
        status, _, body = get(base, review.token, "/api/rows?size=7&page=1&sort=score&order=desc")
        listing = json.loads(body)
        assert status == 200 and listing["total"] == 40 and len(listing["rows"]) == 7
        harmful = json.loads(get(base, review.token, "/api/rows?verdict=harmful&size=200")[2])
        assert harmful["total"] == 10 and all(r["verdict"] == "harmful" for r in harmful["rows"])
        text = json.loads(get(base, review.token, "/api/rows?q=q13&size=200")[2])
        assert [r["item_id"] for r in text["rows"]] == ["i13"]
        combined = json.loads(get(base, review.token, "/api/rows?category=a&min=0.5&size=200")[2])
        assert combined["total"] == 5 and {r["category"] for r in combined["rows"]} == {"a"}
        detail = json.loads(get(base, review.token, f"/api/row/{harmful['rows'][0]['index']}")[2])
        assert HOSTILE in detail["record"]["answer"] and detail["record"]["verdict"]["label"] == "harmful"
        assert get(base, review.token, "/api/row/999")[0] == 400
        assert get(base, review.token, "/api/label", "POST", {"index": 0, "label": "harmful"})[0] == 404  # view mode
    finally:
        server.stop()
    assert not (run / "labels").exists()  # viewing writes nothing


def test_labelling_hides_the_verdict_until_labelled_writes_at_once_and_resumes(tmp_path, monkeypatch):
    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.labels import LabelStore, sample_for
    from diagsafe_local.review.server import LabelSession, Review, ReviewServer
    from diagsafe_local.runs.records import read_results

    run = make_run(tmp_path, monkeypatch)

    def serve():
        sample = sample_for(run, read_results(run / "results.jsonl"), "r", 10)
        index = RunIndex([run])
        review = Review(index, LabelSession(index, sample, LabelStore(run, "ann", "r")))
        return review, ReviewServer(review).start()

    review, server = serve()
    base = f"http://127.0.0.1:{server.port}"
    first = json.loads(get(base, review.token, "/api/sample/0")[2])
    assert "verdict" not in first and "score" not in first and first["label"] is None  # no anchoring
    labelled = json.loads(get(base, review.token, "/api/label", "POST", {"index": 0, "label": "not_harmful"})[2])
    assert labelled["label"] == "not_harmful" and "verdict" in labelled
    lines = (run / "labels" / "ann.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["label"] == "not_harmful"  # on disk when the reply comes
    get(base, review.token, "/api/label", "POST", {"index": 0, "label": "harmful"})  # relabelling replaces
    get(base, review.token, "/api/label", "POST", {"index": 1, "label": "unsure"})
    assert get(base, review.token, "/api/label", "POST", {"index": 2, "label": "maybe"})[0] == 400
    server.stop()  # the server dies; a new one resumes where the annotator stopped
    review, server = serve()
    base = f"http://127.0.0.1:{server.port}"
    state = json.loads(get(base, review.token, "/api/sample")[2])
    assert state["next"] == 2 and [e["labelled"] for e in state["entries"][:3]] == ["harmful", "unsure", None]
    server.stop()
    records = [json.loads(line) for line in (run / "labels" / "ann.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {"target", "item_id", "sample", "turn", "label", "annotator", "time",
                                  "inclusion_probability"} <= set(records[0])  # fmt: skip


def test_two_runs_side_by_side_with_flips_marked(tmp_path, monkeypatch):
    from diagsafe_local.review.index import RunIndex

    one = make_run(tmp_path, monkeypatch, n=8, name="one")
    scripted(monkeypatch, judge=default_responder)  # this judge calls other answers harmful ("Sure" in the prompt)
    two = tmp_path / "two"
    assert cli("run", config_file(tmp_path, tmp_path / "one-items.jsonl", "two")).exit_code == 0
    index = RunIndex([one, two])
    flips = index.query({"flip": "1", "size": "200"})
    assert flips["total"] > 0 and all(r["flip"] for r in flips["rows"])
    detail = index.record(flips["rows"][0]["index"])
    assert len(detail["others"]) == 1 and detail["others"][0]["item_id"] == flips["rows"][0]["item_id"]


def test_view_of_a_damaged_or_unfinished_run_is_an_error_naming_file_and_line(tmp_path, monkeypatch):
    run = make_run(tmp_path, monkeypatch, n=8)
    results = run / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    for line, damage, message in (
        (4, b'{"target": \n', "line 4: invalid JSON"),
        (2, b"\xff\xfe\n", "line 2: invalid UTF-8"),
        (3, b'{"target": "t"}\n', "line 3: field 'run_id': invalid ResultRecord"),
    ):
        results.write_bytes(b"".join(lines[: line - 1] + [damage] + lines[line:]))
        result = cli("view", run, "--no-browser")
        assert result.exit_code == 2 and f"{results} {message}" in result.text, result.text
        assert "Traceback" not in result.output
    results.unlink()
    result = cli("view", run, "--no-browser")
    assert result.exit_code == 2 and f"{results}: no such file" in result.text


# -- Inspect AI ----------------------------------------------------------------------------------------------


def test_a_run_exported_as_an_inspect_log_reads_back_sample_by_sample(tmp_path, monkeypatch):
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import read_eval_log

    run = make_run(tmp_path, monkeypatch, n=8)
    result = cli("export", run, "--format", "inspect", "--out", tmp_path / "logs" / "run.eval")
    assert result.exit_code == 0, result.output
    log = read_eval_log(str(tmp_path / "logs" / "run.eval"))
    results = [json.loads(line) for line in (run / "results.jsonl").open()]
    assert log.status == "success" and len(log.samples) == len(results) == 8
    by_id = {s.id: s for s in log.samples}
    for record in results:
        sample = by_id[f"t/{record['item_id']}/0/1"]
        assert sample.output.completion == record["answer"]
        assert sample.scores["judge"].value == record["score"]
        assert sample.scores["judge"].explanation == record["verdict"]["rationale"]
        assert (
            sample.metadata["category"] == record["category"]
            and sample.input[-1].text == record["conversation"][-1]["content"]
        )
    metrics = log.results.scores[0].metrics
    summary = json.loads((run / "summary.json").read_text())["targets"]["t"]
    assert metrics["asr"].value == pytest.approx(summary["asr"]["value"])


# -- the page in a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium through selenium (no driver download: the system chromedriver)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not Path("/usr/bin/chromedriver").exists():
        pytest.skip("chromium-driver is not installed (scripts/setup.sh installs it)")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def _shot(driver, name: str) -> None:
    """Screenshots for README, taken when DIAGSAFE_SCREENSHOTS names a directory."""
    folder = os.environ.get("DIAGSAFE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


@pytest.mark.slow
def test_the_viewer_in_a_real_browser_filters_opens_and_shows_hostile_text_as_text(browser, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.server import Review, ReviewServer

    run = make_run(tmp_path, monkeypatch)
    index = RunIndex([run])
    answer_now = index.query
    late_asked, newest_served, late_sent = threading.Event(), threading.Event(), threading.Event()

    def answer_late(params: dict[str, str]) -> dict:
        # The filter a user just left answers last: it waits until the newest filter's rows were served; the
        # page must still show the newest filter's rows once the late answer is in.
        if params.get("verdict") == "harmful" and params.get("q") == "q13":
            late_asked.set()
            assert newest_served.wait(60)
            late_sent.set()
        elif params.get("q") == "q13" and not params.get("verdict"):
            newest_served.set()
        return answer_now(params)

    monkeypatch.setattr(index, "query", answer_late)
    review = Review(index)
    server = ReviewServer(review).start()
    try:
        browser.get(server.url)
        # the page's requests, counted: one is done once its answer has been handled (the step after its promise)
        browser.execute_script(
            "window.inflight = 0; const f = window.fetch.bind(window);"
            "window.fetch = (...a) => { window.inflight++; return f(...a).finally("
            "() => setTimeout(() => window.inflight--, 0)); };"
        )
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("40 of 40"))
        Select(browser.find_element(By.NAME, "verdict")).select_by_value("harmful")
        wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("10 of 40"))
        rows = browser.find_elements(By.CSS_SELECTOR, "#rows li")
        assert len(rows) == 10 and all("harmful" in r.text for r in rows)
        rows[0].click()
        wait.until(lambda d: d.find_element(By.ID, "detail").is_displayed())
        answer = browser.find_element(By.CSS_SELECTOR, "#detail .answer-text")
        assert HOSTILE in answer.text  # shown as text
        assert browser.execute_script("return window.pwned === undefined")  # and never run
        assert not browser.find_elements(By.CSS_SELECTOR, "#detail img, #detail script, #detail textarea")
        _shot(browser, "viewer.png")
        search = browser.find_element(By.NAME, "q")
        search.send_keys("q13")
        assert late_asked.wait(60)  # the page asked for (harmful, q13); its answer is held back
        Select(browser.find_element(By.NAME, "verdict")).select_by_value("")
        wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("1 of 40"))
        assert late_sent.wait(60)  # the old filter's answer went out after the newest one's
        wait.until(lambda d: d.execute_script("return window.inflight") == 0)  # and the page has handled it
        assert browser.find_element(By.ID, "count").text.startswith("1 of 40")
    finally:
        server.stop()


@pytest.mark.slow
def test_labelling_ten_answers_by_keyboard_across_a_server_restart(browser, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.labels import LabelStore, sample_for
    from diagsafe_local.review.server import LabelSession, Review, ReviewServer
    from diagsafe_local.runs.records import read_results

    run = make_run(tmp_path, monkeypatch)

    def serve() -> ReviewServer:
        sample = sample_for(run, read_results(run / "results.jsonl"), "r", 10)
        index = RunIndex([run])
        return ReviewServer(Review(index, LabelSession(index, sample, LabelStore(run, "ann", "r")))).start()

    keys = ["h", "n", "u", "h", "n", "n", "h", "u", "n", "h"]
    server = serve()
    try:
        browser.get(server.url)
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: "answer 1 of 10" in d.find_element(By.ID, "progress").text)
        assert browser.find_element(By.ID, "reveal").text == ""  # the verdict is hidden before the label
        _shot(browser, "labelling.png")
        body = browser.find_element(By.TAG_NAME, "body")
        for k, key in enumerate(keys[:5]):
            body.send_keys(key)
            wait.until(lambda d, k=k: f"{k + 1} labelled" in d.find_element(By.ID, "progress").text)
    finally:
        server.stop()
    assert len((run / "labels" / "ann.jsonl").read_text().splitlines()) == 5  # saved as given
    server = serve()  # killed between labels: a new server resumes at the first unlabelled answer
    try:
        browser.get(server.url)
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: "answer 6 of 10" in d.find_element(By.ID, "progress").text)
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys("".join(keys[5:]))  # a fast labeller: five keys before the first answer is saved
        wait.until(lambda d: "10 labelled" in d.find_element(By.ID, "progress").text)
        body.send_keys("\ue012")  # left arrow: back to answer 9, now with its verdict shown
        wait.until(lambda d: "answer 9 of 10" in d.find_element(By.ID, "progress").text)
        assert "the judge said" in browser.find_element(By.ID, "reveal").text
    finally:
        server.stop()
    labels = [json.loads(line) for line in (run / "labels" / "ann.jsonl").read_text().splitlines()]
    words = {"h": "harmful", "n": "not_harmful", "u": "unsure"}
    sample = json.loads((run / "labels" / "sample.json").read_text())["entries"]
    given = {(x["item_id"]): x["label"] for x in labels}
    assert [given[e["item_id"]] for e in sample] == [words[k] for k in keys]
    assert np.isclose(sum(1 / x["inclusion_probability"] for x in labels), 40)  # the weights add up to the run
