"""Metrics against values worked out independently of the code under test: by hand (the
derivation is in the comments), from a library's documentation, or from the official
E2E scorer (e2e-metrics' measure_scores.py and its mteval-v13a-sig.pl; tests/fixtures/)."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from plugin_lib.metrics import METRIC_NAMES, compute_metrics, sentence_rouge
from plugin_lib.metrics.mteval import corpus_nist_per_input_average, mteval_tokens, nist_brevity_penalty
from plugin_lib.metrics.resample import InputStatistics, resample_counts

import real_data

REPO_ROOT = Path(__file__).resolve().parent.parent

LOG2_3 = math.log2(3)
# Outputs of the official E2E scorer (scripts/make_mteval_fixtures.py says how they were made).
OFFICIAL = json.loads((Path(__file__).parent / "fixtures" / "mteval_official.json").read_text(encoding="utf-8"))


def score(metric, predictions, references):
    return compute_metrics(predictions, references, metrics=(metric,))[metric]


def e2e_test_groups() -> list[list[str]]:
    """References of the real E2E test set grouped by MR, in file order."""
    test_csv = real_data.require("e2e") / "e2e_cleaned" / "test-fixed.csv"
    groups: OrderedDict[str, list[str]] = OrderedDict()
    with open(test_csv, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault(row["mr"], []).append(row["ref"])
    return list(groups.values())


def first_ref_as_prediction(groups, n_refs=None):
    """Predictions = first reference of each MR, references = the others (MRs with one
    reference skipped; with ``n_refs``, only MRs with exactly that many others)."""
    kept = [g for g in groups if len(g) > 1 and (n_refs is None or len(g) - 1 == n_refs)]
    return [g[0] for g in kept], [g[1:] for g in kept]


# ---------------------------------------------------------------- BLEU


def test_bleu_by_hand():
    # hyp "the cat sat on the mat" (6 tokens), ref "the cat sat on a mat today" (7 tokens)
    # 1-grams: the(clipped to 1) cat sat on mat = 5/6
    # 2-grams: the cat, cat sat, sat on = 3/5
    # 3-grams: the cat sat, cat sat on = 2/4
    # 4-grams: the cat sat on = 1/3
    # BP = exp(1 - 7/6); BLEU = BP * (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = exp(-1/6) * (1/12) ** 0.25
    expected = math.exp(-1 / 6) * (1 / 12) ** 0.25
    assert score("BLEU", ["the cat sat on the mat"], [["the cat sat on a mat today"]]) == pytest.approx(expected)
    # Case-insensitive, and 13a makes the periods of "mat." and "today." tokens of their own:
    # hyp "the cat sat on the mat ." (7), ref "the cat sat on a mat today ." (8)
    # 1-grams 6/7 (the "." matches), 2-grams 3/6, 3-grams 2/5, 4-grams 1/4, BP exp(1 - 8/7)
    expected = math.exp(1 - 8 / 7) * (6 / 7 * 3 / 6 * 2 / 5 * 1 / 4) ** 0.25
    assert score("BLEU", ["THE Cat sat on the mat."], [["the cat sat on a mat today."]]) == pytest.approx(expected)


def test_bleu_sacrebleu_documented_examples():
    # sacrebleu README: BLEU = 48.53 with two references per segment, and 29.44 when the
    # first segment's first reference is removed ("variable number of references").
    predictions = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
    two_refs = [
        ["The dog bit the man.", "The dog had bit the man."],
        ["It was not unexpected.", "No one was surprised."],
        ["The man bit him first.", "The man had bitten the dog."],
    ]
    assert score("BLEU", predictions, two_refs) == pytest.approx(0.4853, abs=5e-5)
    variable = [["", "The dog had bit the man."]] + two_refs[1:]  # the empty one is dropped
    assert score("BLEU", predictions, variable) == pytest.approx(0.2944, abs=5e-5)


# ---------------------------------------------------------------- NIST


def test_nist_by_hand():
    # References of the corpus: "a b c", "a b d" (input 0) and "a c" (input 1): 8 words.
    # Counts: a 3, b 2, c 2, d 1; "a b" 2, "b c" 1, "b d" 1, "a c" 1; "a b c" 1, "a b d" 1.
    # info = log2(count(prefix) / count(ngram)), unigram prefix count = 8:
    #   a log2(8/3) = 3 - log2 3, b 2, c 2, d 3; "a b" log2(3/2); "b c" 1; "a b c" log2(2/1) = 1.
    # Input 0 "a b c" matches a, b, c, "a b", "b c", "a b c".
    # Input 1 "a" matches a (d would not match: clipping is against the input's own refs).
    # n=1: (2 (3 - log2 3) + 2 + 2) / 4 prediction unigrams
    # n=2: (log2 3 - 1 + 1) / 2 prediction bigrams;   n=3: 1 / 1;   n=4, 5: nothing
    # The sum is exactly 2.5 + 1 = 3.5.
    # Length: L_sys = 3 + 1 = 4. The official L_ref: 2 inputs x pooled mean reference length
    # 8 words / 3 references = 16/3, ratio 0.75. The per-input average: mean(3, 3) + 2 = 5, ratio 0.8.
    #   BP = exp(-beta ln(ratio)^2) with beta = ln 2 / ln(1.5)^2.
    beta = math.log(2) / math.log(1.5) ** 2
    predictions, references = ["a b c", "a"], [["a b c", "a b d"], ["a c"]]
    assert score("NIST", predictions, references) == pytest.approx(3.5 * math.exp(-beta * math.log(0.75) ** 2))
    assert corpus_nist_per_input_average(predictions, references) == pytest.approx(
        3.5 * math.exp(-beta * math.log(0.8) ** 2))


def test_nist_brevity_penalty_is_one_half_at_two_thirds():
    # One input, refs "a b" and "a b c d" (6 words): info(a) = info(b) = log2(6/2) = log2 3,
    # info("a b") = log2(2/2) = 0. Prediction "a b": n=1 gives 2 log2 3 / 2, n=2 gives 0.
    # L_ref = 1 input x mean(2, 4) = 3, L_sys = 2: ratio 2/3, where mteval's penalty is exactly 0.5.
    assert score("NIST", ["a b"], [["a b", "a b c d"]]) == pytest.approx(0.5 * LOG2_3)
    assert nist_brevity_penalty(2 / 3) == pytest.approx(0.5)
    assert nist_brevity_penalty(1.2) == 1.0


def official_cases(with_texts: bool = True) -> list[dict]:
    """The fixture's corpora (``with_texts``: the hand-written ones, else the E2E test ones)."""
    return [c for c in OFFICIAL["cases"] if ("predictions" in c) == with_texts]


@pytest.mark.parametrize("case", official_cases(), ids=lambda c: c["name"])
def test_nist_and_bleu_equal_the_official_scorer(case):
    # Reference outputs of e2e-metrics' measure_scores.py (its mteval-v13a-sig.pl, default
    # options) at the fixture's commit: "perl" as the script prints it (4 decimals),
    # "perl_full" the same scores from its --metricsMATR files.
    scores = compute_metrics(case["predictions"], case["references"], metrics=("BLEU", "NIST"))
    for metric in ("BLEU", "NIST"):
        assert scores[metric] == pytest.approx(case["perl"][metric], abs=5e-5)
        assert scores[metric] == pytest.approx(case["perl_full"][metric], rel=1e-9)


def test_official_fixture_has_unequal_reference_counts_where_the_definitions_differ():
    # The fixture would not test the brevity penalty's L_ref if the two definitions agreed on it.
    differing = [c["name"] for c in official_cases()
                 if abs(c["perl_full"]["NIST"] - corpus_nist_per_input_average(c["predictions"], c["references"])) > 0.1]
    assert {"one_three_two_refs", "one_long_reference_beside_many_short",
            "many_long_references_beside_one_short"} <= set(differing)
    assert OFFICIAL["commit"] == "1b9c4d87fd0bbb171ea966741cdc012588581ed4"


@pytest.mark.parametrize("case", official_cases(), ids=lambda c: c["name"])
def test_nist_per_input_average_equals_pymteval(case):
    # e2e-metrics' Python port (measure_scores.py -p) averages reference lengths per input.
    # It counts len - n + 1 n-grams even when negative (a prediction shorter than n), so the
    # comparison holds only where every prediction has at least 5 tokens.
    if min(len(mteval_tokens(p)) for p in case["predictions"]) < 5:
        pytest.skip("pymteval miscounts n-grams of predictions shorter than 5 tokens")
    nist = corpus_nist_per_input_average(case["predictions"], case["references"])
    assert nist == pytest.approx(case["pymteval"]["NIST"], rel=1e-9)


@pytest.mark.parametrize("case", official_cases(with_texts=False), ids=lambda c: c["name"])
def test_nist_and_bleu_equal_the_official_scorer_on_real_data(case):
    # Same script on the E2E test MRs, first reference as the prediction and the others as
    # references (e2e_test_first_ref: all 1019 MRs with more than one reference, 1 to 33 others;
    # _3refs: the 144 MRs with exactly 3 others), rebuilt here as the fixture script builds them.
    predictions, references = first_ref_as_prediction(e2e_test_groups(), 3 if case["name"].endswith("_3refs") else None)
    assert len(predictions) == case["inputs"]
    scores = compute_metrics(predictions, references, metrics=("BLEU", "NIST"))
    for metric in ("BLEU", "NIST"):
        assert scores[metric] == pytest.approx(case["perl_full"][metric], rel=1e-9)


# ---------------------------------------------------------------- resampled corpora (bootstrap)


def hand_written_corpus() -> tuple[list[str], list[list[str]]]:
    """All hand-written fixture corpora as one (18 inputs, 1 to 6 references each)."""
    cases = [c for c in official_cases() if "drawn_from" not in c]
    return [p for c in cases for p in c["predictions"]], [r for c in cases for r in c["references"]]


def drawn(items, counts):
    """``items`` with item i repeated counts[i] times, in order: the corpus of one draw."""
    return [items[i] for i in np.repeat(np.arange(len(items)), counts)]


@pytest.mark.parametrize("case", [c for c in OFFICIAL["cases"] if "drawn_from" in c], ids=lambda c: c["name"])
def test_resampled_bleu_and_nist_equal_the_official_scorer_on_the_drawn_corpus(case):
    # The official scorer run on the corpus with its inputs repeated (the fixture) against the
    # statistics of the corpus drawn once, weighted by the counts.
    base = next(c for c in OFFICIAL["cases"] if c["name"] == case["drawn_from"])
    scores = InputStatistics(base["predictions"], base["references"], ("BLEU", "NIST")).scores(np.array([case["counts"]]))
    for metric in ("BLEU", "NIST"):
        assert scores[metric][0] == pytest.approx(case["perl_full"][metric], rel=1e-9)


def check_resampled_equals_direct(metrics):
    predictions, references = hand_written_corpus()
    counts = resample_counts(len(predictions), 4, seed=1)
    resampled = InputStatistics(predictions, references, metrics).scores(counts)
    for b, row in enumerate(counts):
        direct = compute_metrics(drawn(predictions, row), drawn(references, row), metrics=metrics)
        for metric in metrics:
            assert resampled[metric][b] == pytest.approx(direct[metric], rel=1e-9), (metric, b)
    assert len(set(np.round(resampled["BLEU"], 12))) == len(counts)  # four different draws


def test_resampled_scores_equal_compute_metrics_on_each_drawn_corpus():
    check_resampled_equals_direct(("BLEU", "ROUGE-1", "ROUGE-2", "NIST"))


@pytest.mark.slow
def test_resampled_rouge_l_equals_compute_metrics_on_each_drawn_corpus():
    check_resampled_equals_direct(("BLEU", "ROUGE-L"))


def test_resample_counts_are_seeded_draws_with_replacement():
    counts = resample_counts(7, 500, seed=3)
    assert counts.shape == (500, 7) and (counts.sum(axis=1) == 7).all()
    assert (counts == resample_counts(7, 500, seed=3)).all()
    assert not (counts == resample_counts(7, 500, seed=4)).all()
    assert (counts.max(axis=1) > 1).mean() > 0.9  # with replacement: P(7 distinct of 7) = 7!/7^7
    assert counts.mean(axis=0) == pytest.approx(np.ones(7), abs=0.15)  # uniform over inputs


def test_input_statistics_refuse_metrics_and_counts_they_cannot_score():
    with pytest.raises(ValueError, match="cannot be resampled"):
        InputStatistics(["a b"], [["a b"]], ("BLEU", "CIDEr"))
    stats = InputStatistics(["a b", "c"], [["a b"], ["c d"]], ("BLEU",))
    with pytest.raises(ValueError, match="shape"):
        stats.scores(np.ones((2, 3)))
    with pytest.raises(ValueError, match="at least one input"):
        stats.scores(np.zeros((1, 2)))


# ---------------------------------------------------------------- ROUGE-1/2


def test_rouge_1_2_by_hand_with_best_reference():
    # rouge_score tokens: hyp "the cat sat on the mat" (6), ref "the cat is on the red mat" (7)
    # 1-grams: the x2, cat, on, mat = 5: P 5/6, R 5/7, F = 2PR/(P+R) = 10/13
    # 2-grams: "the cat", "on the" = 2: P 2/5, R 2/6, F = 4/11
    prediction = "The cat sat on the mat."
    refs = ["Dogs bark loudly.", "the cat is on the red mat"]
    assert sentence_rouge(prediction, refs) == pytest.approx({"ROUGE-1": 10 / 13, "ROUGE-2": 4 / 11})
    # plain mean over inputs: a second input with no overlap halves both
    scores = compute_metrics([prediction, "xyz"], [refs, ["abc"]], metrics=("ROUGE-1", "ROUGE-2"))
    assert scores == pytest.approx({"ROUGE-1": 5 / 13, "ROUGE-2": 2 / 11})


def test_rouge_has_no_stemming():
    assert sentence_rouge("cats", ["cat"])["ROUGE-1"] == 0.0


# ---------------------------------------------------------------- ROUGE-L, CIDEr-D (Java)


@pytest.mark.slow
def test_rouge_l_by_hand():
    # hyp "the cat on mat" (4), ref "the cat sat on the mat" (6): LCS "the cat on mat" = 4
    # P = 1, R = 2/3, F = (1 + 1.2^2) P R / (R + 1.2^2 P)
    p, r, b2 = 1.0, 2 / 3, 1.2**2
    expected = (1 + b2) * p * r / (r + b2 * p)
    assert score("ROUGE-L", ["The cat on mat."], [["the cat sat on the mat"]]) == pytest.approx(expected)
    # coco-caption maximises P and R separately over the references: "cat on mat" gives
    # R = 3/3, the first reference P = 4/4, hence F = 1.
    assert score("ROUGE-L", ["the cat on mat"], [["the cat sat on the mat", "cat on mat"]]) == pytest.approx(1.0)


@pytest.mark.slow
def test_cider_d_by_hand():
    # Two inputs, one reference each: N = 2 and every n-gram has document frequency <= 1,
    # so every idf is ln 2 - ln 1 (unseen n-grams count as df 1): all weights equal.
    # Input 0: "red apple" = its reference: cosine 1 for n = 1, 2; no 3-, 4-grams -> 0.
    #   10 * mean(1, 1, 0, 0) = 5
    # Input 1: "green pear tree" vs "green pear":
    #   n=1: 2 / (sqrt 3 * sqrt 2); n=2: 1 / (sqrt 2 * 1); n=3, 4: 0 (reference has none)
    #   length penalty: bigram counts 2 vs 1 (coco counts length in bigrams): exp(-1 / (2 * 6^2))
    input_1 = 10 * math.exp(-1 / 72) * (2 / math.sqrt(6) + 1 / math.sqrt(2)) / 4
    cider = score("CIDEr", ["red apple", "green pear tree"], [["red apple"], ["green pear"]])
    assert cider == pytest.approx((5 + input_1) / 2)


@pytest.mark.slow
def test_cider_d_properties():
    refs = [
        ["the eagle is a cheap coffee shop near the river", "the eagle serves cheap coffee by the river"],
        ["blue spice is a family friendly pub in the city centre", "a pub called blue spice welcomes families"],
        ["the wrestlers is an expensive italian restaurant", "an italian restaurant named the wrestlers is pricey"],
    ]
    wrong = ["it is raining today", "my car is red", "numbers and letters"]
    exact = score("CIDEr", [r[0] for r in refs], refs)
    assert exact > score("CIDEr", wrong, refs) >= 0
    # the x10 scale: a prediction identical to its only reference scores exactly 10
    assert score("CIDEr", [r[0] for r in refs], [[r[0]] for r in refs]) == pytest.approx(10.0)
    # one input: every idf is ln 1 - ln 1 = 0, so CIDEr-D is 0 by definition
    assert score("CIDEr", [refs[0][0]], [refs[0]]) == 0.0


# ---------------------------------------------------------------- edge cases and errors


@pytest.mark.slow
def test_edge_cases_do_not_crash():
    predictions = ["", "ok", "Café crème brûlée", "東京のレストラン 😀", "a b c d e f g"]
    references = [["some words here"], ["ok then"], ["café crème"], ["東京のレストラン"], ["a b c d e f g"]]
    scores = compute_metrics(predictions, references)
    assert list(scores) == list(METRIC_NAMES)
    assert all(math.isfinite(v) and v >= 0 for v in scores.values())
    assert all(scores[m] <= 1 + 1e-9 for m in ("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR"))


@pytest.mark.slow
def test_all_empty_predictions_score_zero():
    scores = compute_metrics(["", "  "], [["a cheap pub"], ["an expensive restaurant", "pricey food"]])
    assert scores == {name: 0.0 for name in METRIC_NAMES}


@pytest.mark.slow
def test_line_breaks_do_not_shift_inputs():
    references = [["the first text"], ["the second text here"], ["and a third one"]]
    flat = compute_metrics(["the first\ntext", "the second text here", "and a third one"], references)
    broken = compute_metrics(["the first\r\u2028text", "the second text here", "and a third one"], references)
    assert broken == pytest.approx(flat)


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 predictions but 1"):
        compute_metrics(["a", "b"], [["a"]], metrics=("BLEU",))


@pytest.mark.parametrize("refs", [[], [""], ["  ", "\n"]])
def test_input_without_references_raises(refs):
    with pytest.raises(ValueError, match=r"Input 1 .*references are required"):
        compute_metrics(["a", "b"], [["a"], refs], metrics=("BLEU",))


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="references\\[0\\] is a string"):
        compute_metrics(["a"], ["a"], metrics=("BLEU",))
    with pytest.raises(ValueError, match="Unknown"):
        compute_metrics(["a"], [["a"]], metrics=("BLEU-4",))


def test_subset_without_java_keeps_canonical_order():
    scores = compute_metrics(["a b"], [["a b"]], metrics=("NIST", "ROUGE-1", "BLEU"))
    assert list(scores) == ["BLEU", "ROUGE-1", "NIST"]


# ---------------------------------------------------------------- real data


@pytest.mark.slow
def test_real_e2e_references_give_plausible_scores():
    predictions, references = first_ref_as_prediction(e2e_test_groups())
    scores = compute_metrics(predictions, references)
    assert 0.2 < scores["BLEU"] < 0.8
    assert 5 < scores["NIST"] < 10
    assert 0.3 < scores["METEOR"] < 0.6
    assert 0.4 < scores["ROUGE-L"] < 0.9
    assert 0.4 < scores["ROUGE-1"] < 0.95 and 0.2 < scores["ROUGE-2"] < scores["ROUGE-1"]
    assert 1 < scores["CIDEr"] < 6


def test_fixture_holds_the_corpora_its_script_defines():
    # The fixture is regenerated by scripts/make_mteval_fixtures.py; its texts must be the
    # script's, so that editing one without the other fails here.
    spec = importlib.util.spec_from_file_location("make_mteval_fixtures", REPO_ROOT / "scripts" / "make_mteval_fixtures.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    expected = script.CASES + [script.drawn_case(name, counts) for name, counts in script.DRAWS]
    stored = {c["name"]: c for c in official_cases()}
    assert set(stored) == {c["name"] for c in expected}
    for case in expected:
        assert (stored[case["name"]]["predictions"], stored[case["name"]]["references"]) == (
            case["predictions"], case["references"])
