"""The paper's prompts (Appendix "Prompts"), in-context demonstrations, and chat formatting.

Every prompt is the paper's text verbatim, with its slot (``[attributes]``, ``[facts]`` or
``[concepts]``) replaced by the example's source (see ``plugin_lib.data``). The paper's LLaMA
prompt for E2E has no slot; the attributes follow it as ``" Attributes: [attributes]
Sentence:"``, the way the paper's other LLaMA prompts present their inputs.

In-context learning (ICL) prompts are blocks separated by a blank line::

    Below are a list of demonstrations:

    <prompt filled with demonstration 1's source> <its reference>

    ...

    <prompt filled with the query's source>
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .datasets import Example

FAMILIES = ("gpt2-m", "gpt2-xl", "llama")
SLOTS = {"e2e": "[attributes]", "webnlg": "[facts]", "commongen": "[concepts]",
         "adidas": "[attributes]"}

_COMMONGEN_GPT2 = "One coherent sentence that uses all the following concepts: [concepts], is:"
_ADIDAS_GPT2 = ("Given the following attributes of a product, write a description. "
                "Attributes: [attributes] Description:")
PAPER_PROMPTS = {
    "e2e": {
        "gpt2-m": "Given the following aspects of a restaurant, [attributes], a natural "
                  "language sentence describing the restaurant is:",
        "gpt2-xl": "Imagine you are writing a one-sentence description for a restaurant, given "
                   "the following aspects: [attributes], a human-readable natural language "
                   "sentence describing the restaurant is:",
        "llama": "Please convert the following attributes into a coherent sentence. Do not "
                 "provide an explanation.",
    },
    "webnlg": {
        "gpt2-m": "Convert the following facts into a coherent sentence: Facts: [facts] "
                  "Sentence:",
        "gpt2-xl": "You are given the following facts. Facts: [facts] A short, coherent "
                   "sentence summarizing the facts is:",
        "llama": "Do not provide an explanation or follow-up. Just convert the following facts "
                 "of an entity into a coherent sentence. Facts: [facts] Sentence:",
    },
    "commongen": {
        "gpt2-m": _COMMONGEN_GPT2,
        "gpt2-xl": _COMMONGEN_GPT2,
        "llama": "Please write a coherent sentence that uses all the following concepts. "
                 "Concepts: [concepts] Sentence:",
    },
    "adidas": {
        "gpt2-m": _ADIDAS_GPT2,
        "gpt2-xl": _ADIDAS_GPT2,
        "llama": "Please write a description of this product given the following attributes. "
                 "Attributes: [attributes] Description:",
    },
}
ICL_HEADER = "Below are a list of demonstrations:"
BLOCK_SEPARATOR = "\n\n"


def template(dataset: str, family: str) -> str:
    """The prompt with its slot; a paper prompt without a slot gets one appended."""
    if dataset not in PAPER_PROMPTS:
        raise ValueError(f"Unknown dataset {dataset!r}. Choose one of: {', '.join(SLOTS)}.")
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}. Choose one of: {', '.join(FAMILIES)}.")
    text, slot = PAPER_PROMPTS[dataset][family], SLOTS[dataset]
    return text if slot in text else f"{text} Attributes: {slot} Sentence:"


def fill(dataset: str, family: str, source: str) -> str:
    """The prompt for one input."""
    return template(dataset, family).replace(SLOTS[dataset], source)


def build_prompt(dataset: str, family: str, source: str,
                 demonstrations: Iterable[tuple[Example | str, str]] = ()) -> str:
    """The prompt for ``source``, preceded by ICL demonstrations if any are given.

    ``demonstrations`` are (example or source, reference) pairs, e.g. from
    :func:`sample_demonstrations`.
    """
    query = fill(dataset, family, source)
    blocks = [f"{fill(dataset, family, getattr(demo, 'source', demo))} {reference}"
              for demo, reference in demonstrations]
    return BLOCK_SEPARATOR.join([ICL_HEADER, *blocks, query]) if blocks else query


def sample_demonstrations(pool: Sequence[Example], k: int, seed: int,
                          exclude_ids: Iterable[str] = ()) -> list[tuple[Example, str]]:
    """``k`` distinct examples of the training pool, each with one of its references.

    The same pool and seed give the same demonstrations. Examples whose id is in
    ``exclude_ids`` (e.g. the query itself) are skipped; test-split examples are refused.
    """
    test_ids = [e.id for e in pool if e.meta.get("split") == "test"]
    if test_ids:
        raise ValueError(f"Demonstrations must not come from the test split; the pool holds "
                         f"{len(test_ids)} test examples (e.g. {test_ids[0]}).")
    excluded = set(exclude_ids)
    candidates = [e for e in pool if e.id not in excluded]
    if not 0 <= k <= len(candidates):
        raise ValueError(f"Cannot draw k={k} demonstrations from {len(candidates)} examples.")
    rng = np.random.RandomState(seed)
    chosen = [candidates[i] for i in rng.permutation(len(candidates))[:k]]
    return [(e, e.references[rng.randint(len(e.references))]) for e in chosen]


def format_for_model(prompt: str, tokenizer=None, use_chat_template: bool = False) -> str:
    """The prompt as given, or as a single user turn of the tokenizer's chat template
    followed by the generation prompt."""
    if not use_chat_template:
        return prompt
    if tokenizer is None:
        raise ValueError("use_chat_template=True needs a tokenizer.")
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
