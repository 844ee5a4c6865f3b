"""Prompts in the ``authors`` style: the strings of the authors' code (stair-lab/plugin-llm,
utils/data_preprocess.py and src/evaluate_models.py get_ic_prompt), per dataset and family, on
real examples; their ICL context and demonstration draw; the profile setting that picks them."""
from types import SimpleNamespace

import numpy as np
import pytest

from plugin_lib import data
from plugin_lib.data import Example, prompts
from plugin_lib.harness import methods, tasks
from plugin_lib.harness.profile import load_profile, profile_names

import real_data

# Sources of real validation examples (checked against the data below when it is there).
REAL = {
    "e2e": ("e2e-validation-00081", "name[Aromi], eatType[coffee shop], food[English], customer rating[low], "
                                    "area[riverside], familyFriendly[yes]"),
    "webnlg": ("webnlg-validation-00015", "A.C._Lumezzane | ground | Italy; Italy | leader | Pietro_Grasso"),
    "commongen": ("commongen-validation-00008", "circle, sit, talk"),
    "adidas": ("adidas-validation-00027", "name: Copa Sense.3 Turf Shoes, category: Shoes, selling_price: 64, "
                                          "color: White"),
}
E2E_LINES = ("name -- Aromi,\neatType -- coffee shop,\nfood -- English,\nrating -- low,\narea -- riverside,\n"
             "familyFriendly -- yes")
FACTS = "A.C._Lumezzane | ground | Italy\nItaly | leader | Pietro_Grasso\n"
ADIDAS_LINES = "name -- Copa Sense.3 Turf Shoes,\ncategory -- Shoes,\nprice -- 64,\ncolor -- White"
EXPECTED = {
    ("e2e", "gpt2-m"): 'Given the following aspects of a restaurant, "name[Aromi], eatType[coffee shop], '
                       'food[English], customer rating[low], area[riverside], familyFriendly[yes]", a natural '
                       'language sentence describing the restuarant is: ',
    ("e2e", "gpt2-xl"): 'Imagine you are writing a one-sentence description for a restaurant, given the following '
                        f'aspects: "{E2E_LINES}", a human-readable natural language sentence describing the '
                        'restuarant is: ',
    ("e2e", "llama"): "Please convert the following attributes into a coherent sentence. Do not provide "
                      f"explanation.\n\nAttributes:\n{E2E_LINES}\n\nSentence:\n",
    ("webnlg", "gpt2-m"): f"Convert the following facts into a coherent sentence:\n\nFacts:\n{FACTS}\nSentence: ",
    ("webnlg", "gpt2-xl"): f"You are given the following facts.\n\nFacts:\n{FACTS}\nA short, coherent sentence "
                           "summarizing the facts is: ",
    ("webnlg", "llama"): "Do not provide explanation or follow-up. Just convert the following facts of an entity "
                         f"into a coherent sentence.\n\nFacts:\n{FACTS}\nSentence: ",
    ("commongen", "gpt2-m"): "One coherent sentence that uses all the following concepts: circle, sit, talk, is: ",
    ("commongen", "gpt2-xl"): "One coherent sentence that uses all the following concepts: circle, sit, talk, is: ",
    ("commongen", "llama"): "Please write a coherent sentence that uses all the following concepts.\n\n"
                            "Concepts:\ncircle, sit, talk\nSentence: ",
    ("adidas", "gpt2-m"): "Given the following attributes of a product, write a description.\n\n"
                          "name[Copa Sense.3 Turf Shoes], category[Shoes], price[64], color[White]\n\nDescription:",
    ("adidas", "gpt2-xl"): "Given the following attributes of a product, write a description.\n\n"
                           f"{ADIDAS_LINES}\n\nDescription:",
    ("adidas", "llama"): "Please write a description of this product given the following attributes.\n\n"
                         f"{ADIDAS_LINES}\n\nDescription:\n",
}


@pytest.mark.parametrize("dataset, family", sorted(EXPECTED))
def test_authors_prompt_of_a_real_example(dataset, family):
    source = REAL[dataset][1]
    assert prompts.build_prompt(dataset, family, source) == EXPECTED[dataset, family]  # authors: the default
    assert prompts.build_prompt(dataset, family, source, style="authors") == EXPECTED[dataset, family]


def test_the_literal_sources_are_the_real_examples():
    real_data.require("e2e", "webnlg", "commongen", "adidas")
    for dataset, (example_id, source) in REAL.items():
        (example,) = [ex for ex in data.load_dataset(dataset, "validation") if ex.id == example_id]
        assert example.source == source


def test_attribute_lines_follow_the_authors_pattern():
    # "customer rating" cannot match \w+ across its space: the key reads "rating", as in the authors' prompts.
    assert prompts.attribute_lines("customer rating[5 out of 5], near[The Bakers]") == (
        "rating -- 5 out of 5,\nnear -- The Bakers")
    # A ";" inside a WebNLG object stays in its triple.
    assert prompts.authors_input("webnlg", 'T | formerName | "A VA; B VD;"; T | mass | 5') == (
        'T | formerName | "A VA; B VD;"\nT | mass | 5\n')
    assert prompts.authors_input("adidas", "name: X, category: , selling_price: 3, color: Red") == (
        "name[X], category[None], price[3], color[Red]")


# ---------------------------------------------------------------- ICL


def demo(i: int, source: str, reference: str, rows=None, split: str = "validation") -> Example:
    meta = {"split": split} if rows is None else {"split": split, "rows": rows}
    return Example(f"x-{split}-{i:05d}", source, (reference,) if isinstance(reference, str) else reference, meta)


def test_authors_icl_context_per_family():
    first = demo(0, "name[A], customer rating[low]", "A is rated low.")
    second = demo(1, "name[B]", "B.")
    pairs = [(first, "A is rated low."), (second, "B.")]
    e2e_header = "Below are examples of (Attributes, Sentence) pairs for some restaurants.\n\n<examples>\n\n"
    assert prompts.build_prompt("e2e", "llama", "name[C]", pairs) == (
        e2e_header
        + "Attributes:\nname -- A,\nrating -- low\n\nSentence:\nA is rated low.\n\n"
        + "Attributes:\nname -- B\n\nSentence:\nB.\n\n"
        + "</examples>\n"
        + "Please convert the following attributes into a coherent sentence. Do not provide explanation.\n\n"
          "Attributes:\nname -- C\n\nSentence:\n")
    gpt2_m_prompt = ('Given the following aspects of a restaurant, "name[B]", a natural language sentence '
                     'describing the restuarant is: ')
    assert prompts.authors_context("e2e", "gpt2-m", pairs[1:]) == (
        e2e_header + gpt2_m_prompt + "B.\n" + "</examples>\n")
    gpt2_xl_prompt = ('Imagine you are writing a one-sentence description for a restaurant, given the following '
                      'aspects: "name -- B", a human-readable natural language sentence describing the '
                      'restuarant is: ')
    assert prompts.authors_context("e2e", "gpt2-xl", pairs[1:]) == (
        e2e_header + gpt2_xl_prompt + "\nB.\n\n" + "</examples>\n")

    facts = [(demo(2, "S | p | O", "S p O."), "S p O.")]
    assert prompts.authors_context("webnlg", "gpt2-m", facts) == (
        "Consider the following examples of entity descriptions from facts.\n\n<examples>\n\n"
        "Example 1 --\nFacts:\nS | p | O\n\nSentence: S p O.\n\n</examples>\n")
    assert prompts.authors_context("webnlg", "llama", facts * 2).count("Example 2 --\nFacts:\n") == 1
    assert prompts.authors_context("webnlg", "gpt2-xl", facts) == (  # no header, no footer
        "You are given the following facts.\n\nFacts:\nS | p | O\n\n"
        "A short, coherent sentence summarizing the facts is: S p O.\n\n")

    assert prompts.authors_context("commongen", "llama", [("dog, run", "A dog runs.")]) == (
        "Below are examples of converting given concepts into a coherent sentence.\n\n<start_of_examples>\n\n"
        "Concepts:\ndog, run\nSentence: A dog runs.\n\n<end_of_examples>\n")
    product = "name: Cap, category: Accessories, selling_price: 20, color: Black"
    assert prompts.authors_context("adidas", "llama", [(product, "A cap.")]) == (
        "Below are examples of product attributes and their descriptions.\n\n<start_of_examples>\n\n"
        "Attributes:name -- Cap,\ncategory -- Accessories,\nprice -- 20,\ncolor -- Black\n\nDescription:\n"
        "A cap.\n\n<end_of_examples>\n")
    assert prompts.authors_context("adidas", "gpt2-m", [(product, "A cap.")]).endswith(
        "name[Cap], category[Accessories], price[20], color[Black]\n\nDescription:A cap.\n<end_of_examples>\n")
    assert prompts.build_prompt("e2e", "llama", "name[C]", []) == prompts.build_prompt("e2e", "llama", "name[C]")


def test_authors_draw_is_the_authors_rule_with_replacement_in_row_order():
    # Rows in the authors' order: row 0 is a's second reference, row 1 b's, row 2 a's first.
    pool = [demo(0, "name[a]", ("a first", "a second"), rows=(2, 0)), demo(1, "name[b]", "b only", rows=(1,))]
    in_row_order = ["a second", "b only", "a first"]
    state = np.random.get_state()
    try:  # the authors' call, on numpy's global generator
        np.random.seed(42)
        expected = np.random.choice(len(in_row_order), 8)
    finally:
        np.random.set_state(state)
    drawn = prompts.authors_demonstrations(pool, 8)
    assert [reference for _, reference in drawn] == [in_row_order[i] for i in expected]
    assert all(reference in example.references for example, reference in drawn)
    assert len({reference for _, reference in drawn}) < len(drawn)  # with replacement: 8 draws from 3 rows
    assert prompts.authors_demonstrations(pool, 0) == []
    with pytest.raises(ValueError, match="test split"):
        prompts.authors_demonstrations(pool + [demo(2, "name[t]", "t", split="test")], 1)
    with pytest.raises(ValueError, match="k=2"):
        prompts.authors_demonstrations([], 2)


def test_the_authors_context_is_the_same_for_every_input_and_seed(monkeypatch):
    train = [demo(i, f"name[R{i}]", f"R{i}.", rows=(i,)) for i in (0, 2, 3)]
    hyper = [demo(1, "name[R1]", "R1.", rows=(1,))]
    test = [demo(i, f"name[T{i}]", f"T{i}.", split="test") for i in range(4)]
    base = SimpleNamespace(tokenizer=None)
    authors = tasks.Task(base, "e2e", "llama", train, hyper, test)
    assert authors.prompt_style == "authors"
    contexts = [authors.demonstrations(3, seed) for seed in (0, 1, 2)]
    assert all(demos == contexts[0][0] for per_input in contexts for demos in per_input)
    assert {ex.id for ex, _ in contexts[0][0]} <= {ex.id for ex in train + hyper}  # hyper rows are in the pool

    seen = []
    monkeypatch.setattr(methods, "generate", lambda base, texts, *args, **kwargs: seen.append(texts) or texts)
    decoding = load_profile("smoke").decoding
    for seed in (0, 1):
        methods.predict(authors, "ICL-3", None, seed, decoding, progress=False)
    context = prompts.authors_context("e2e", "llama", contexts[0][0])
    assert seen[0] == seen[1] == [context + prompts.fill("e2e", "llama", ex.source) for ex in test]

    appendix = tasks.Task(base, "e2e", "llama", train, hyper, test, prompt_style="appendix")
    per_input = appendix.demonstrations(2, seed=0)
    assert per_input != appendix.demonstrations(2, seed=1) and len({tuple(d) for d in per_input}) > 1
    assert all({ex.id for ex, _ in demos} <= {ex.id for ex in train} for demos in per_input)


def test_the_profile_chooses_the_prompts():
    styles = {name: load_profile(name).prompts for name in profile_names()}
    assert styles == {"paper": "authors", "local": "appendix", "confirm": "authors", "smoke": "authors",
                      "paper-twin": "authors", "paper-twin-gpu": "authors", "colab": "authors", "wave3": "authors",
                      "wave4": "authors"}
    assert load_profile("local", prompts="authors").prompts == "authors"
    with pytest.raises(ValueError, match="smoke.prompts: Input should be 'authors' or 'appendix', got 'paper'"):
        load_profile("smoke", prompts="paper")
