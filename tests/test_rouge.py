"""Our ROUGE equals the rouge-score package on a varied corpus, for all 24 variants."""

from __future__ import annotations

import itertools
import random

import pytest
from rouge_score.rouge_scorer import RougeScorer

from diagsafe_local.metrics import TextPair, compute_metrics
from diagsafe_local.metrics.rouge import MEASURES, ROUGE_TYPES, lcs_indices, lcs_length, metric_name

CORPUS = [
    "",
    "   ",
    "!!! ... ???",
    "Sure, here is how to do it:",
    "The cats were running quickly across the gardens; the dog ran after them.",
    "A cat runs quickly across a garden.\nThe dogs are running after it.\n\nThen they rest.",
    "Step 1: mix the flour.\nStep 2: add 200g of sugar.\nStep 3: bake at 180C for 25 minutes.",
    "step one mix flour step two add sugar step three bake",
    "Ünïcödé wörds, naïve café, résumé — and “quotes” with ’apostrophes’ don't matter.",
    "x-ray X-RAY x ray xray 42 4 2 forty-two",
    "generalization generalizations generalize generalized generalizing general",
    "I'm sorry, but I cannot help with that request.\nIf you have other questions, ask.",
    "the the the the the cat cat",
    "cat the cat the cat the",
    "\n\nleading newlines\nand trailing\n\n",
    "Repeating words repeating WORDS repeating Words.",
    "Numbers 1 2 3 4 5 6 7 8 9 10 and 1,000,000 and 3.14159.",
    "A long answer with many lines:\n- first point about running\n- second point about runners\n- third: ran, runs",
]


def _pairs():
    rng = random.Random(11)
    words = " ".join(CORPUS).split(" ")
    generated = [
        "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(rng.randint(1, 4)))
        for _ in range(60)
    ]
    texts = CORPUS + generated
    return list(itertools.product(texts[:30], texts[:30])) + list(zip(texts, reversed(texts)))


@pytest.mark.parametrize("stem", [True, False])
def test_all_variants_equal_rouge_score(stem):
    pairs = _pairs()
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=stem)
    names = [metric_name(t, m, stem) for t in ROUGE_TYPES for m in MEASURES]
    ours = compute_metrics(names, [TextPair("p", response, reference) for reference, response in pairs])
    checked = 0
    for k, (reference, response) in enumerate(pairs):
        expected = scorer.score(reference, response)
        for rouge_type in ROUGE_TYPES:
            exp = expected[rouge_type]
            for measure, value in zip(MEASURES, (exp.precision, exp.recall, exp.fmeasure)):
                got = ours[metric_name(rouge_type, measure, stem)][k]
                assert got == pytest.approx(value, abs=1e-12), (rouge_type, measure, reference, response)
                checked += 1
    assert checked == len(pairs) * 12 > 10_000


def test_stemming_changes_scores():
    pair = [TextPair("p", "the cats were running", "a cat runs")]
    scores = compute_metrics(["rouge1_recall", "rouge1_recall_nostem"], pair)
    assert scores["rouge1_recall"][0] == pytest.approx(2 / 3)  # cat, run (the 'a' is unmatched)
    assert scores["rouge1_recall_nostem"][0] == 0.0


def test_lcs_hand_cases():
    assert lcs_length("a b c b d a b".split(), "b d c a b a".split()) == 4
    assert lcs_length([], ["a"]) == 0
    assert lcs_indices("a b c".split(), "c a b".split()) == [0, 1]


def test_light_stemmer_load_matches_rouge_score_and_leaves_nltk_importable():
    """The stemmer is loaded without `nltk/__init__` (2.3 s saved per bench); in a fresh process its stems must
    equal rouge-score's, and a full `import nltk` afterwards must still work."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from diagsafe_local.metrics.rouge import tokenize\n"
        "words = 'running generously happiness caresses ponies relational conditional hopeful agreed'\n"
        "ours = tokenize(words, True)\n"
        "assert 'nltk' not in sys.modules and 'scipy' not in sys.modules\n"
        "from rouge_score import tokenize as rs\n"
        "from nltk.stem import porter\n"
        "theirs = tuple(rs.tokenize(words, porter.PorterStemmer()))\n"
        "import nltk, nltk.translate.meteor_score\n"
        "assert ours == theirs, (ours, theirs)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("stem", [True, False])
def test_lsum_union_lcs_equals_rouge_score_where_several_lcs_exist(stem):
    """Few words, many lines, many repeats: where rouge-score's backtracking and any other choice of LCS differ
    (rapidfuzz's alignment picks another LCS in 42% of such sequences), ROUGE-Lsum must still be rouge-score's."""
    rng = random.Random(5)
    vocab = ["cat", "dog", "runs", "running", "the", "a", "mixes", "mixing", "heat", "slowly"]

    def text() -> str:
        return "\n".join(
            " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 14))) for _ in range(rng.randint(1, 5))
        )

    pairs = [(text(), text()) for _ in range(1500)]
    scorer = RougeScorer(["rougeLsum", "rougeL"], use_stemmer=stem)
    names = [metric_name(t, m, stem) for t in ("rougeLsum", "rougeL") for m in MEASURES]
    ours = compute_metrics(names, [TextPair("p", response, reference) for reference, response in pairs])
    for k, (reference, response) in enumerate(pairs):
        expected = scorer.score(reference, response)
        for rouge_type in ("rougeLsum", "rougeL"):
            exp = expected[rouge_type]
            for measure, value in zip(MEASURES, (exp.precision, exp.recall, exp.fmeasure)):
                assert ours[metric_name(rouge_type, measure, stem)][k] == pytest.approx(value, abs=1e-12), (
                    rouge_type,
                    measure,
                    reference,
                    response,
                )


def test_bench_scores_of_the_published_layout_equal_rouge_score():
    """Through `bench`'s own path (the published-layout reader, every reference of a prompt, their mean), all
    24 variants of every scored response equal rouge-score's."""
    from pathlib import Path

    from diagsafe_local.benchmark.dataset import load_dataset
    from diagsafe_local.benchmark.runner import score_responses

    data = load_dataset(Path(__file__).parents[1] / "data" / "sample_harmmetric.jsonl")
    names = [metric_name(t, m, stem) for stem in (True, False) for t in ROUGE_TYPES for m in MEASURES]
    scores = score_responses(data, names).set_index(["response_id", "metric"])["score"]
    scorers = {stem: RougeScorer(list(ROUGE_TYPES), use_stemmer=stem) for stem in (True, False)}
    checked = 0
    for prompt in data.prompts:
        for response in prompt.responses:
            for stem, scorer in scorers.items():
                each = [scorer.score(ref, response.text) for ref in prompt.references]
                for rouge_type in ROUGE_TYPES:
                    for k, measure in enumerate(MEASURES):
                        expected = sum(s[rouge_type][k] for s in each) / len(each)
                        got = scores[(response.response_id, metric_name(rouge_type, measure, stem))]
                        assert got == pytest.approx(expected, abs=1e-12), (response.response_id, rouge_type, measure)
                        checked += 1
    assert checked == data.n_responses * 24 >= 2_000
