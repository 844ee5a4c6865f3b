"""Prompts in the ``appendix`` style (the paper's typeset texts), its ICL structure and seeded
demonstrations; chat formatting. The ``authors`` style: tests/test_prompts_authors.py."""
import re
from pathlib import Path

import pytest

from plugin_lib.data import Example, prompts

PAPER_TEX = Path(__file__).resolve().parents[2] / "shared/paper/logits-are-all-we-need.tex"


def pool(n: int = 10, split: str = "validation") -> list[Example]:
    return [Example(f"e2e-{split}-{i:05d}", f"name[R{i}]", (f"R{i} a.", f"R{i} b."),
                    {"split": split}) for i in range(n)]


def test_appendix_prompts_are_the_paper_texts():
    assert prompts.build_prompt("e2e", "gpt2-m", "name[Aromi], eatType[pub]", style="appendix") == (
        "Given the following aspects of a restaurant, name[Aromi], eatType[pub], a natural "
        "language sentence describing the restaurant is:")
    assert prompts.build_prompt("webnlg", "gpt2-xl", "A | b | C", style="appendix") == (
        "You are given the following facts. Facts: A | b | C A short, coherent sentence "
        "summarizing the facts is:")
    assert prompts.build_prompt("commongen", "gpt2-xl", "dog, frisbee", style="appendix") == (
        "One coherent sentence that uses all the following concepts: dog, frisbee, is:")
    assert prompts.build_prompt("adidas", "llama", "name: Shorts", style="appendix") == (
        "Please write a description of this product given the following attributes. "
        "Attributes: name: Shorts Description:")


def test_llama_e2e_appends_the_attributes():
    prompt = prompts.build_prompt("e2e", "llama", "name[Aromi]", style="appendix")
    assert prompt == ("Please convert the following attributes into a coherent sentence. Do "
                      "not provide an explanation. Attributes: name[Aromi] Sentence:")


def test_prompts_match_the_paper_source():
    if not PAPER_TEX.exists():
        pytest.skip(f"the paper's LaTeX source is not at {PAPER_TEX}")
    appendix = PAPER_TEX.read_text(encoding="utf-8").split(r"\label{ssec:prompts_app}")[1]
    appendix = appendix.split("in-context learning")[0]
    boxed = [" ".join(text.split()) for text in re.findall(
        r"\\begin\{mdframed\}.*?\\texttt\{(.*?)\}\s*\\end\{mdframed\}", appendix, re.S)]
    ours = [prompts.APPENDIX_PROMPTS[d][f] for d, families in [
        ("e2e", ["gpt2-m", "gpt2-xl", "llama"]), ("webnlg", ["gpt2-m", "gpt2-xl", "llama"]),
        ("commongen", ["gpt2-m", "llama"]), ("adidas", ["gpt2-m", "llama"])] for f in families]
    assert boxed == ours
    assert prompts.APPENDIX_PROMPTS["commongen"]["gpt2-xl"] == prompts.APPENDIX_PROMPTS[
        "commongen"]["gpt2-m"]


def test_every_template_has_its_slot_once():
    for dataset, slot in prompts.SLOTS.items():
        for family in prompts.FAMILIES:
            assert prompts.template(dataset, family).count(slot) == 1


def test_unknown_dataset_or_family_lists_the_valid_ones():
    with pytest.raises(ValueError, match="e2e, webnlg, commongen, adidas"):
        prompts.build_prompt("xsum", "llama", "x")
    with pytest.raises(ValueError, match="gpt2-m, gpt2-xl, llama"):
        prompts.build_prompt("e2e", "t5", "x")
    with pytest.raises(ValueError, match="authors, appendix"):
        prompts.build_prompt("e2e", "llama", "x", style="paper")


def test_appendix_icl_prompt_structure():
    demos = [(pool()[0], "R0 a."), ("name[Other]", "Other b.")]
    prompt = prompts.build_prompt("commongen", "gpt2-m", "cat, mat", demos, style="appendix")
    blocks = prompt.split("\n\n")
    assert blocks == [
        "Below are a list of demonstrations:",
        "One coherent sentence that uses all the following concepts: name[R0], is: R0 a.",
        "One coherent sentence that uses all the following concepts: name[Other], is: Other b.",
        "One coherent sentence that uses all the following concepts: cat, mat, is:",
    ]


def test_demonstrations_are_seeded_and_distinct():
    first = prompts.sample_demonstrations(pool(), k=4, seed=7)
    assert first == prompts.sample_demonstrations(pool(), k=4, seed=7)
    assert first != prompts.sample_demonstrations(pool(), k=4, seed=8)
    assert len({e.id for e, _ in first}) == 4
    assert all(reference in example.references for example, reference in first)
    assert prompts.sample_demonstrations(pool(), k=0, seed=7) == []


def test_demonstrations_never_come_from_the_test_split():
    with pytest.raises(ValueError, match="test"):
        prompts.sample_demonstrations(pool() + pool(2, "test"), k=2, seed=0)


def test_demonstrations_skip_excluded_ids():
    examples = pool(3)
    chosen = prompts.sample_demonstrations(examples, k=2, seed=0,
                                           exclude_ids=[examples[0].id])
    assert {e.id for e, _ in chosen} == {examples[1].id, examples[2].id}
    with pytest.raises(ValueError, match="k=3"):
        prompts.sample_demonstrations(examples, k=3, seed=0, exclude_ids=[examples[0].id])


def test_format_for_model_plain_and_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert prompts.format_for_model("Hi.", tokenizer) == "Hi."
    assert prompts.format_for_model("Hi.", tokenizer, use_chat_template=True) == (
        "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="tokenizer"):
        prompts.format_for_model("Hi.", use_chat_template=True)
