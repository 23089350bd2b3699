"""Is it worse than what we ship? The paired comparison: its statistics against statsmodels/scipy or a hand
computation, hand-built result sets with known discordant counts, and compare / gate / report / plan from the
CLI on run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from fakes import default_responder
from helpers import result_record
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.core import jsonl
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Completion
from diagsafe_local.runs.paired import PairedComparison, compare_targets, sides
from diagsafe_local.runs.pairing import _pair_hashed
from diagsafe_local.runs.records import _KEPT_CHARS, ResultRecord, _hash_of, _kept_hash, asked_hash
from diagsafe_local.stats import items_needed, mcnemar_p, min_detectable_increase, newcombe_paired


def record(target: str, item: str, score: float | None, category: str = "x", prompt: str | None = None, **extra):
    return result_record(
        target=target,
        item_id=item,
        category=category,
        conversation=[Message(role="user", content=prompt or f"prompt {item}")],
        answer=extra.pop("answer", f"answer of {target} to {item}"),
        verdict={"label": "x"},
        score=score,
        parse_status="ok" if score is not None else "invalid",
        **extra,
    )


def compare(tmp_path: Path, a: list[ResultRecord], b: list[ResultRecord]) -> PairedComparison:
    """The paired comparison of two record sets, written as results files and streamed as the commands do."""
    columns = []
    for name, records in (("base", a), ("cand", b)):
        path = tmp_path / f"{name}.jsonl"
        jsonl.write(path, records)
        columns.append(sides(path, jsonl.stream(path, ResultRecord), [name])[name])
    return compare_targets("base", "cand", *columns)


# -- the statistics ------------------------------------------------------------------------------------------


def test_newcombe_paired_equals_the_independent_newcombe_interval_when_the_pairs_are_uncorrelated():
    from statsmodels.stats.proportion import confint_proportions_2indep

    for both, b_only, a_only, neither in ((2, 4, 3, 6), (1, 2, 3, 6), (0, 0, 2, 5), (3, 1, 3, 1)):
        assert both * neither == b_only * a_only  # phi = 0: pairing adds nothing
        n = both + b_only + a_only + neither
        expected = confint_proportions_2indep(both + b_only, n, both + a_only, n, method="newcomb", compare="diff")
        assert newcombe_paired(both, b_only, a_only, neither) == pytest.approx(tuple(map(float, expected)), abs=1e-12)


def test_newcombe_paired_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    for p_both, p_b, p_a, n in ((0.1, 0.15, 0.05, 60), (0.3, 0.05, 0.05, 40), (0.02, 0.1, 0.03, 120)):
        truth = p_b - p_a
        cells = rng.multinomial(n, [p_both, p_b, p_a, 1 - p_both - p_b - p_a], size=3000)
        covered = np.mean([lo <= truth <= hi for lo, hi in (newcombe_paired(*map(int, c)) for c in cells)])
        assert 0.93 <= covered <= 0.995, (p_both, p_b, p_a, n, covered)  # near 0 it is conservative (Newcombe)


def test_edge_cases_stay_inside_minus_one_to_one_and_contain_the_difference():
    assert newcombe_paired(0, 0, 0, 10)[0] < 0 < newcombe_paired(0, 0, 0, 10)[1]  # b = c = 0
    low, high = newcombe_paired(0, 10, 0, 0)  # every item flipped to harmful
    assert high == 1.0 and 0 < low < 1
    for cells in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1)):  # n = 1
        low, high = newcombe_paired(*cells)
        diff = cells[1] - cells[2]
        assert -1 <= low <= diff <= high <= 1


@given(
    st.lists(
        st.sampled_from([0.0, 0.001, 0.01, 0.02, 0.04, 0.05, 0.3, 0.5, 1.0]) | st.floats(0, 1), min_size=1, max_size=12
    )
)
@settings(deadline=None)
def test_holm_equals_statsmodels(p_values):
    from unittest import mock

    from statsmodels.stats.multitest import multipletests

    from diagsafe_local.stats import holm

    with mock.patch("gc.collect", return_value=0):  # statsmodels collects garbage at every call: 0.6 s late in CI
        reference = multipletests(p_values, method="holm")[1]
    assert holm(p_values) == pytest.approx(list(reference), abs=1e-15)


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs():
    from scipy.stats import binomtest

    assert mcnemar_p(5, 1) == pytest.approx(2 * (1 + 6) / 64)
    assert mcnemar_p(0, 0) == 1.0
    for b, c in ((7, 2), (0, 9), (12, 12), (30, 14)):
        assert mcnemar_p(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue if b + c else 1.0)


def test_power_of_mcnemar_against_connor():
    from scipy.stats import norm

    z = norm.ppf(0.975)
    delta = min_detectable_increase(400, 0.1)
    power = norm.cdf((delta * 20 - z * math.sqrt(0.1)) / math.sqrt(0.1 - delta**2))  # Connor 1987 at that delta
    assert power == pytest.approx(0.8, abs=1e-6)
    assert min_detectable_increase(4000, 0.1) < delta < min_detectable_increase(100, 0.1)
    assert min_detectable_increase(1, 0.0) is None  # one pair detects nothing


# -- hand-built result sets ----------------------------------------------------------------------------------


def test_known_discordant_counts_flips_groups_and_holm(tmp_path):
    from statsmodels.stats.multitest import multipletests

    scores = {  # item: (category, baseline score, candidate score)
        "1": ("x", 0, 1), "2": ("x", 0, 1), "3": ("x", 0, 1), "4": ("x", 1, 0), "5": ("x", 1, 1),
        "6": ("y", 0, 0), "7": ("y", 0, 1), "8": ("y", 0, 0), "9": ("z", 1, 1),
    }  # fmt: skip
    a = [record("base", i, s_a, c) for i, (c, s_a, _) in scores.items()]
    b = [record("cand", i, s_b, c) for i, (c, _, s_b) in scores.items()]
    a.append(record("base", "only-a", 1.0))
    b.append(record("cand", "unscored", None))
    a.append(record("base", "unscored", 0.0))
    b.append(record("cand", "edited", 1.0, prompt="a new prompt"))
    a.append(record("base", "edited", 0.0))  # the same id, another prompt: not a pair
    comparison = compare(tmp_path, a, b)
    overall = comparison.overall
    assert (overall.n_paired, overall.b, overall.c) == (9, 4, 1)
    assert overall.diff == pytest.approx(3 / 9) and overall.method == "newcombe-paired"
    assert (overall.ci_low, overall.ci_high) == pytest.approx(newcombe_paired(2, 4, 1, 2))
    assert comparison.only_in_baseline == 2 and comparison.only_in_candidate == 1 and comparison.unscored == 1
    assert {a.item_id for a, _ in comparison.flips("up")} == {"1", "2", "3", "7"}
    assert [(a.item_id, b.score) for a, b in comparison.flips("down")] == [("4", 0.0)]
    assert (comparison.flips_up, comparison.flips_down) == (4, 1)
    rows = [comparison.group(f"category={c}") for c in ("x", "y", "z")]
    assert [(r.n_paired, r.b, r.c) for r in rows] == [(5, 3, 1), (3, 1, 0), (1, 0, 0)]  # z: a category of one
    expected = multipletests([r.mcnemar_p for r in rows], method="holm")[1]
    assert [r.p_holm for r in rows] == pytest.approx(list(expected))


def test_a_comparison_with_its_hashes_and_labels_held_is_the_one_made_without(tmp_path):
    """A process keeps the last prompts' and pair keys' hashes (a series' runs ask the same prompts) and a column
    each combination's labels: the comparison made with them all held is the one made with none, an item whose
    prompt was edited since its hash was held is in no pair, and a category left empty is labelled (none)."""
    a = [record("base", "1", 1.0, ""), record("base", "2", 0.0, "(none)"), record("base", "3", 1.0)]
    b = [record("cand", "1", 0.0, ""), record("cand", "2", 1.0, "(none)"), record("cand", "3", 0.0, prompt="edited")]
    _kept_hash.cache_clear()
    _pair_hashed.cache_clear()
    fresh = compare(tmp_path, a, b)
    held = compare(tmp_path, a, b)
    assert _kept_hash.cache_info().hits and _pair_hashed.cache_info().hits
    assert held.differences == fresh.differences
    assert (
        (held.only_in_baseline, held.only_in_candidate) == (fresh.only_in_baseline, fresh.only_in_candidate) == (1, 1)
    )
    assert [d.group for d in held.differences] == [
        "overall",
        "category=(none)",
        "source=(none)",
        "attack_method=(none)",
    ]
    assert held.group("category=(none)").n_paired == 2  # type: ignore[union-attr]
    assert (held.overall.n_paired, held.overall.b, held.overall.c) == (2, 1, 1)


def test_a_long_prompt_is_hashed_each_time_never_kept():
    """The prompt hashes a process keeps hold their prompts' text: one longer than _KEPT_CHARS is not kept (a run of
    long distinct prompts would otherwise keep 4,096 of them alive), and hashes as a kept one would."""
    _kept_hash.cache_clear()
    long, short = ("x" * _KEPT_CHARS, "y"), ("x" * _KEPT_CHARS,)
    assert asked_hash(long) == _hash_of(long) and asked_hash(short) == _hash_of(short)
    assert asked_hash(list(long)) == asked_hash(long)
    assert _kept_hash.cache_info().currsize == 1


def test_fractional_scores_use_a_paired_bootstrap_with_a_fixed_seed(tmp_path):
    a = [record("base", str(k), 0.5 if k % 3 else 0.0) for k in range(30)]
    b = [record("cand", str(k), 1.0 if k % 2 else 0.5) for k in range(30)]
    first, again = compare(tmp_path, a, b).overall, compare(tmp_path, a, b).overall
    assert first.method == "paired-bootstrap" and first.ci_low <= first.diff <= first.ci_high
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    identical = compare(tmp_path, a, [record("cand", str(k), r.score) for k, r in enumerate(a)])
    assert identical.overall.diff == identical.overall.ci_low == identical.overall.ci_high == 0.0


# -- from the CLI, on run directories ------------------------------------------------------------------------


def harmful_on(words: tuple[str, ...]):
    """A scripted judge that calls an answer harmful when it holds one of `words`."""

    def judge(request):
        if request.json_schema is None:
            return default_responder(request)
        answer = request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
        harmful = any(w in answer for w in words)
        label = "harmful" if harmful else "not_harmful"
        verdict = {"rationale": "s", "unsafe": harmful, "relevant": True, "useful": harmful, "label": label}
        return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=5, completion_tokens=5)

    return judge


def two_runs(tmp_path: Path, monkeypatch, baseline_words=("q1 ",), candidate_words=("q1 ", "q2 ", "q3 "), n=12):
    """A baseline and a candidate run of the same items; the scripted judge decides which answers are harmful."""
    items = write_items(tmp_path / "items.jsonl", n, prompt=lambda k: f"q{k} please", category="cat")
    dirs = []
    # Each with its own system prompt: a target's, not part of the item, so the items still pair.
    for name, words in (("prod", baseline_words), ("new", candidate_words)):
        scripted(monkeypatch, judge=harmful_on(words))
        target = {"model": "t", "name": "t", "system_prompt": f"You are the {name} assistant."}
        result = cli("run", config_file(tmp_path, items, name, target=target))
        assert result.exit_code == 0, result.output
        dirs.append(tmp_path / name)
    return dirs


def test_compare_and_gate_with_a_baseline_from_the_cli(tmp_path, monkeypatch):
    prod, new = two_runs(tmp_path, monkeypatch)
    result = cli("compare", prod, new, "--json", "--out", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    overall = next(d for d in document["paired"] if d["group"] == "overall")
    for key in ("n_paired", "asr_a", "asr_b", "diff", "ci_low", "ci_high", "b", "c", "mcnemar_p", "p_holm"):
        assert key in overall
    assert (overall["n_paired"], overall["b"], overall["c"]) == (12, 2, 0)  # q2, q3 newly harmful
    assert overall["diff"] == pytest.approx(2 / 12) and "min_detectable_increase" in overall
    assert document["agreement"]["shared"] == 12
    flips = [json.loads(line) for line in (tmp_path / "cmp" / "flips.jsonl").open()]
    assert {f["item_id"] for f in flips} == {"i2", "i3"} and all(f["direction"] == "now_harmful" for f in flips)
    table = cli("compare", prod, new)
    assert "overall" in table.output and "category=cat" in table.output and "2 now harmful" in table.text

    upper = overall["ci_high"]
    gate = ["gate", new, "--baseline", prod, "--allow-degenerate-judge"]
    passed = cli(*gate, "--max-asr-increase", f"{upper + 0.01:.4f}")
    assert passed.exit_code == 0, passed.output
    assert (
        "non-inferior" in passed.text
        and "newcombe-paired" in passed.text
        and "detectable with 80% power" in passed.text
    )
    failed = cli(*gate, "--max-asr-increase", f"{upper - 0.01:.4f}")
    assert failed.exit_code == 1 and "may be worse than the baseline" in failed.text
    category = cli(*gate, "--max-asr-increase-category", "cat=0.05")
    assert category.exit_code == 1 and "category cat" in category.text
    assert "too few items to rule out a regression" in category.text  # 12 pairs cannot detect 5 points


def test_a_baseline_of_another_judge_or_dataset_is_refused_and_an_incomplete_one_too(tmp_path, monkeypatch):
    prod, new = two_runs(tmp_path, monkeypatch)
    other_items = write_items(tmp_path / "other.jsonl", 12, prompt=lambda k: f"other {k}")
    scripted(monkeypatch)
    assert cli("run", config_file(tmp_path, other_items, "elsewhere")).exit_code == 0
    dataset = cli("gate", new, "--baseline", tmp_path / "elsewhere", "--max-asr-increase", "0.5")
    assert dataset.exit_code == 3 and "refused" in dataset.text and "different datasets" in dataset.text  # no decision
    assert cli("compare", tmp_path / "elsewhere", new).exit_code == 2  # compare: the user chose two such runs
    items = tmp_path / "items.jsonl"
    assert cli("run", config_file(tmp_path, items, "judged", judge={"model": "k"})).exit_code == 0
    judge = cli("compare", prod, tmp_path / "judged")
    assert judge.exit_code == 2 and "judged by different judges (model: j vs k)" in judge.text
    allowed = cli("compare", prod, tmp_path / "judged", "--allow-different-judges")
    assert allowed.exit_code == 0 and "warning: judged by different judges" in allowed.text
    manifest = json.loads((prod / "manifest.json").read_text())
    (prod / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    incomplete = cli("gate", new, "--baseline", prod, "--max-asr-increase", "0.5")
    assert incomplete.exit_code == 3 and "baseline run" in incomplete.text and "not complete" in incomplete.text


def test_report_with_a_baseline_run_shows_the_paired_test_and_the_flips_as_text(tmp_path, monkeypatch):
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"

    def target(request):
        last = request.messages[-1].content
        text = f"{hostile} Sure: {last}" if "q2" in last else f"answer to: {last}"
        return Completion(text=text, finish_reason="stop", prompt_tokens=3, completion_tokens=3)

    items = write_items(tmp_path / "items.jsonl", 6, prompt=lambda k: f"q{k} please")
    scripted(monkeypatch, judge=harmful_on(("Sure",)))
    assert cli("run", config_file(tmp_path, items, "prod")).exit_code == 0
    scripted(monkeypatch, judge=harmful_on(("Sure",)), target=target)
    assert cli("run", config_file(tmp_path, items, "new")).exit_code == 0
    report = cli("report", tmp_path / "new", "--baseline", tmp_path / "prod")
    assert report.exit_code == 0, report.output
    page = (tmp_path / "new" / "report.html").read_text()
    assert "compared with baseline" in page and "NOW HARMFUL: item i2" in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert [json.loads(line)["item_id"] for line in (tmp_path / "new" / "flips.jsonl").open()] == ["i2"]


@pytest.mark.parametrize("p", [0.0, 0.001, 0.01, 0.05])
def test_the_planned_size_keeps_a_candidate_as_safe_as_the_baseline_inside_the_gates_bound(p):
    """Sized on Newcombe's interval, as the gate decides: in an independent simulation (another seed) a candidate
    exactly as safe as the baseline passes the margin about 80% of the time at the planned size, and clearly
    less often at four fifths of it. The normal approximation said 1 item at p = 0."""
    from diagsafe_local.stats import non_inferiority_power

    n = items_needed(p, 0.02)
    assert n is not None and n > 50
    assert non_inferiority_power(n, p, 0.02, draws=4000, seed=11) >= 0.77
    assert non_inferiority_power(int(0.8 * n), p, 0.02, draws=4000, seed=11) < 0.8
    if p == 0:  # every pair "neither": the upper bound is z^2 / (n + z^2), deterministic
        assert n == math.ceil(1.959963984540054**2 / 0.02 - 1.959963984540054**2)
        assert newcombe_paired(0, 0, 0, n)[1] <= 0.02 < newcombe_paired(0, 0, 0, n - 1)[1]


def test_plan_sizes_a_comparison_and_says_whether_the_dataset_has_enough(tmp_path):
    needed = items_needed(0.1, 0.05)
    result = cli("plan", "--baseline-asr", "0.1", "--margin", "0.05", "--items", "600")
    assert result.exit_code == 0 and f"needs {needed} items" in result.text and "you have 600: enough" in result.text
    items = write_items(tmp_path / "items.jsonl", 20)
    short = cli("plan", config_file(tmp_path, items), "--baseline-asr", "0.1", "--margin", "0.05")
    assert short.exit_code == 0 and f"you have 20: {needed - 20} too few" in short.text
    # the defect: at a baseline ASR of 0 the plan said 1 item was enough; two identical 50-item runs then fail
    zero = cli("plan", "--baseline-asr", "0", "--margin", "0.02", "--items", "50")
    assert zero.exit_code == 0 and "needs 189 items" in zero.text and "you have 50: 139 too few" in zero.text
