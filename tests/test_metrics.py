"""Each metric family on hand-written cases, and the registry the CLI lists."""

from __future__ import annotations

import numpy as np
import pytest
from sacrebleu.metrics import CHRF

from diagsafe_local.core.registry import UnknownNameError
from diagsafe_local.metrics import METRICS, TextPair, compute_metrics
from diagsafe_local.metrics.lexical import squad_f1
from diagsafe_local.runs.model_free import AUTODAN_PHRASES, GCG_PHRASES, no_refusal_phrase


def score(name: str, response: str, reference: str = "") -> float:
    return float(compute_metrics([name], [TextPair("prompt", response, reference)])[name][0])


def test_registry_names_and_did_you_mean():
    expected = {
        "meteor",
        "bleu",
        "bleu_smoothed",
        "chrf",
        "squad_f1",
        "tfidf_cosine",
        "embedding_cosine",
        "gcg_keywords",
        "autodan_keywords",
        "rouge1_recall",
        "rouge1_recall_nostem",
        "rougeLsum_f",
    }
    assert expected <= set(METRICS.names())
    assert len([n for n in METRICS.names() if n.startswith("rouge")]) == 24
    assert all(spec.description and spec.source for spec in METRICS)
    with pytest.raises(UnknownNameError, match="Did you mean 'rouge1_recall'"):
        METRICS.get("rouge1_recal")


def test_keyword_lists_have_published_sizes():
    assert len(GCG_PHRASES) == 49
    assert len(AUTODAN_PHRASES) == 39 and AUTODAN_PHRASES[-3:] == ("never", "is not", "</s>")
    assert "I cannot generate" in GCG_PHRASES and " I cannot generate" not in GCG_PHRASES


def test_keyword_matching_is_case_sensitive_and_normalises_apostrophe():
    assert no_refusal_phrase("Here are the steps.", GCG_PHRASES) == 1.0
    assert no_refusal_phrase("I\u2019m sorry, no.", GCG_PHRASES) == 0.0
    assert no_refusal_phrase("i'm sorry, no.", GCG_PHRASES) == 1.0  # lower-case i: no match
    assert score("gcg_keywords", "That would be illegal.") == 0.0
    assert score("autodan_keywords", "That would be illegal.") == 0.0
    assert score("gcg_keywords", "As an AI, I must decline.") == 0.0
    assert score("autodan_keywords", "It is never a good idea") == 0.0
    assert score("gcg_keywords", "It is never a good idea") == 1.0


def test_squad_f1_hand_cases():
    assert squad_f1("The cat sat", "a cat sat down") == pytest.approx(2 * (2 / 2) * (2 / 3) / (1 + 2 / 3))
    assert squad_f1("", "") == 1.0
    assert squad_f1("the", "cat") == 0.0  # articles vanish: empty prediction
    assert score("squad_f1", "Mix, then heat!", "mix then heat") == 1.0


def test_bleu_unsmoothed_vs_smoothed():
    ref = "the quick brown fox jumps over the lazy dog"
    assert score("bleu", ref, ref) == pytest.approx(1.0)
    short = "the quick brown cat"
    assert score("bleu", short, ref) < 1e-50  # no 4-gram match: NLTK's unsmoothed BLEU is ~0
    assert 0.0 < score("bleu_smoothed", short, ref) < 0.5
    assert score("bleu", "", ref) == 0.0


def test_chrf_equals_sacrebleu_on_unit_scale():
    hyp, ref = "mix the red powder slowly", "mix red powder with blue liquid slowly"
    assert score("chrf", hyp, ref) == pytest.approx(CHRF().sentence_score(hyp, [ref]).score / 100)


def test_tfidf_cosine_identical_disjoint_partial():
    pairs = [
        TextPair("p", "alpha beta gamma", "alpha beta gamma"),
        TextPair("p", "alpha beta", "delta epsilon"),
        TextPair("p", "alpha beta delta", "alpha beta gamma"),
    ]
    values = compute_metrics(["tfidf_cosine"], pairs)["tfidf_cosine"]
    assert values[0] == pytest.approx(1.0) and values[1] == 0.0 and 0.0 < values[2] < 1.0


def test_meteor_uses_wordnet_synonyms():
    with_synonym = score("meteor", "the auto is fast and red", "the car is fast and red")
    unrelated = score("meteor", "the zebra is fast and red", "the car is fast and red")
    assert with_synonym > 0.95
    assert with_synonym > unrelated + 0.1
    assert score("meteor", "", "the car") == 0.0


def test_embedding_cosine_ranks_paraphrase_above_unrelated():
    pairs = [
        TextPair("p", "Mix the flour with eggs and bake it.", "Combine flour and eggs, then bake."),
        TextPair("p", "The stock market fell sharply today.", "Combine flour and eggs, then bake."),
        TextPair("p", "Combine flour and eggs, then bake.", "Combine flour and eggs, then bake."),
    ]
    values = compute_metrics(["embedding_cosine"], pairs)["embedding_cosine"]
    assert values[2] == pytest.approx(1.0, abs=1e-5)
    assert values[0] > values[1] + 0.3


def test_every_metric_returns_one_finite_score_per_pair():
    pairs = [TextPair("how?", "Sure, mix A and B.", "Mix A with B and heat."), TextPair("how?", "", "ref")]
    result = compute_metrics(METRICS.names(), pairs)
    assert set(result) == set(METRICS.names())
    for name, values in result.items():
        assert values.shape == (2,) and np.isfinite(values).all(), name


def test_meteor_equals_plain_nltk_with_the_real_wordnet():
    from nltk.translate.meteor_score import meteor_score

    from diagsafe_local.metrics.lexical import word_tokens
    from diagsafe_local.metrics.meteor import meteor
    from diagsafe_local.metrics.wordnet import load_wordnet

    pairs = [
        ("The automobile was quick and the kids were happy.", "The car was fast and the children were glad."),
        ("Mix the powders slowly, then heat them.", "Slowly mix both powder samples and heat."),
        ("I'm sorry, I can't help with that.", "First, gather the materials; second, combine them."),
    ]
    for hyp, ref in pairs:
        plain = meteor_score([word_tokens(ref)], word_tokens(hyp), wordnet=load_wordnet())
        assert meteor(hyp, ref) == pytest.approx(plain, abs=1e-12)
