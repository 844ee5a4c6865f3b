r"""The task prompts in two styles, in-context demonstrations, and chat formatting.

A profile chooses the style (``prompts`` in ``harness/profiles.yaml``); ``authors`` is the default.

``authors``: the strings of the authors' code, which produced the paper's numbers
(stair-lab/plugin-llm: ``add_input_prompt`` of each dataset in ``utils/data_preprocess.py``,
``get_ic_prompt`` in ``src/evaluate_models.py``), per dataset and model family, typos included
("restuarant"). A prompt is prefix + input + suffix with the authors' blank-line layout:

- E2E: the MR string as given (GPT2-M, inside double quotes) or one ``key -- value`` line per
  attribute joined with ``",\n"``, read with the authors' pattern ``(\w+)\[([^\]]+)\]``, which
  turns ``customer rating[low]`` into ``rating -- low``.
- WebNLG: one ``subject | property | object`` triple per line, each line ending in ``\n``.
- CommonGen: the concepts joined with ``", "``.
- Adidas: ``name[...], category[...], price[...], color[...]`` as given (GPT2-M) or as
  ``key -- value`` lines; an empty field reads ``None``.

ICL, ``authors``: k demonstrations are drawn once with the authors' rule,
``np.random.seed(42); np.random.choice(len(rows), k)`` (with replacement), from the
(input, reference) rows of the validation split in the authors' row order (``meta["rows"]``,
``data.datasets``). The same context goes before every input, for every seed: a per-dataset
header, the demonstrations in the family's layout (:data:`AUTHORS_DEMONSTRATIONS`), a footer,
then the prompt with no separator.

``appendix``: the paper's typeset Appendix "Prompts", each with its slot (``[attributes]``,
``[facts]`` or ``[concepts]``) replaced by the example's source. The paper's LLaMA prompt for
E2E has no slot; the attributes follow it as ``" Attributes: [attributes] Sentence:"``, the way
the paper's other LLaMA prompts present their inputs. ICL prompts are blocks separated by a
blank line, with k distinct demonstrations drawn per input and seed (:func:`sample_demonstrations`)::

    Below are a list of demonstrations:

    <prompt filled with demonstration 1's source> <its reference>

    ...

    <prompt filled with the query's source>
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .datasets import ADIDAS_FIELDS, Example, adidas_attributes, webnlg_triples

FAMILIES = ("gpt2-m", "gpt2-xl", "llama")
STYLES = ("authors", "appendix")
SLOTS = {"e2e": "[attributes]", "webnlg": "[facts]", "commongen": "[concepts]",
         "adidas": "[attributes]"}

_COMMONGEN_GPT2 = "One coherent sentence that uses all the following concepts: [concepts], is:"
_ADIDAS_GPT2 = ("Given the following attributes of a product, write a description. "
                "Attributes: [attributes] Description:")
APPENDIX_PROMPTS = {
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
APPENDIX_ICL_HEADER = "Below are a list of demonstrations:"
BLOCK_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class AuthorsPrompt:
    """prefix + input + suffix; ``lines``: the attributes as ``key -- value`` lines."""

    prefix: str
    suffix: str
    lines: bool = False


_COMMONGEN_GPT2_AUTHORS = AuthorsPrompt("One coherent sentence that uses all the following concepts: ", ", is: ")
_ADIDAS_GPT2_AUTHORS = "Given the following attributes of a product, write a description.\n\n"
AUTHORS_PROMPTS = {
    "e2e": {
        "gpt2-m": AuthorsPrompt('Given the following aspects of a restaurant, "',
                                '", a natural language sentence describing the restuarant is: '),
        "gpt2-xl": AuthorsPrompt('Imagine you are writing a one-sentence description for a restaurant, given the '
                                 'following aspects: "',
                                 '", a human-readable natural language sentence describing the restuarant is: ',
                                 lines=True),
        "llama": AuthorsPrompt("Please convert the following attributes into a coherent sentence. Do not provide "
                               "explanation.\n\nAttributes:\n", "\n\nSentence:\n", lines=True),
    },
    "webnlg": {
        "gpt2-m": AuthorsPrompt("Convert the following facts into a coherent sentence:\n\nFacts:\n", "\nSentence: "),
        "gpt2-xl": AuthorsPrompt("You are given the following facts.\n\nFacts:\n",
                                 "\nA short, coherent sentence summarizing the facts is: "),
        "llama": AuthorsPrompt("Do not provide explanation or follow-up. Just convert the following facts of an "
                               "entity into a coherent sentence.\n\nFacts:\n", "\nSentence: "),
    },
    "commongen": {
        "gpt2-m": _COMMONGEN_GPT2_AUTHORS,
        "gpt2-xl": _COMMONGEN_GPT2_AUTHORS,
        "llama": AuthorsPrompt("Please write a coherent sentence that uses all the following concepts.\n\n"
                               "Concepts:\n", "\nSentence: "),
    },
    "adidas": {
        "gpt2-m": AuthorsPrompt(_ADIDAS_GPT2_AUTHORS, "\n\nDescription:"),
        "gpt2-xl": AuthorsPrompt(_ADIDAS_GPT2_AUTHORS, "\n\nDescription:", lines=True),
        "llama": AuthorsPrompt("Please write a description of this product given the following attributes.\n\n",
                               "\n\nDescription:\n", lines=True),
    },
}
# The authors' pattern for one attribute: "customer rating[low]" reads as key "rating".
ATTRIBUTE = re.compile(r"(\w+)\[([^\]]+)\]")
AUTHORS_ADIDAS_KEYS = {"name": "name", "category": "category", "selling_price": "price", "color": "color"}


@dataclass(frozen=True)
class AuthorsDemonstration:
    """How the authors laid out one ICL demonstration for a family: ``label`` (``{number}``:
    its position from 1), the prompt (without its first paragraph, the instruction, when
    ``drop_instruction``), ``between``, the reference, ``end``; ``framed``: the whole context
    sits between the dataset's header and footer."""

    label: str = ""
    drop_instruction: bool = False
    between: str = ""
    end: str = "\n\n"
    framed: bool = True


_EXAMPLE_LABEL = "Example {number} --\n"
_GPT2_XL_DEMO = AuthorsDemonstration(between="\n")
AUTHORS_DEMONSTRATIONS = {
    "e2e": {"gpt2-m": AuthorsDemonstration(end="\n"), "gpt2-xl": _GPT2_XL_DEMO,
            "llama": AuthorsDemonstration(drop_instruction=True)},
    "webnlg": {"gpt2-m": AuthorsDemonstration(_EXAMPLE_LABEL, drop_instruction=True),
               "gpt2-xl": AuthorsDemonstration(framed=False),
               "llama": AuthorsDemonstration(_EXAMPLE_LABEL, drop_instruction=True)},
    "commongen": {"gpt2-m": AuthorsDemonstration(), "gpt2-xl": _GPT2_XL_DEMO,
                  "llama": AuthorsDemonstration(drop_instruction=True)},
    # "Attributes:" with no line break after it, as in the authors' contexts.
    "adidas": {"gpt2-m": AuthorsDemonstration(end="\n"), "gpt2-xl": _GPT2_XL_DEMO,
               "llama": AuthorsDemonstration("Attributes:", drop_instruction=True)},
}
AUTHORS_ICL_FRAMES = {
    "e2e": ("Below are examples of (Attributes, Sentence) pairs for some restaurants.\n\n<examples>\n\n",
            "</examples>\n"),
    "webnlg": ("Consider the following examples of entity descriptions from facts.\n\n<examples>\n\n",
               "</examples>\n"),
    "commongen": ("Below are examples of converting given concepts into a coherent sentence.\n\n"
                  "<start_of_examples>\n\n", "<end_of_examples>\n"),
    "adidas": ("Below are examples of product attributes and their descriptions.\n\n<start_of_examples>\n\n",
               "<end_of_examples>\n"),
}
AUTHORS_DEMONSTRATION_SEED = 42


def check_prompt_args(dataset: str, family: str, style: str = "authors") -> None:
    """ValueError listing the valid values for an unknown dataset, model family or style."""
    if dataset not in SLOTS:
        raise ValueError(f"Unknown dataset {dataset!r}. Choose one of: {', '.join(SLOTS)}.")
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}. Choose one of: {', '.join(FAMILIES)}.")
    if style not in STYLES:
        raise ValueError(f"Unknown prompt style {style!r}. Choose one of: {', '.join(STYLES)}.")


def template(dataset: str, family: str) -> str:
    """The appendix prompt with its slot; a paper prompt without a slot gets one appended."""
    check_prompt_args(dataset, family)
    text, slot = APPENDIX_PROMPTS[dataset][family], SLOTS[dataset]
    return text if slot in text else f"{text} Attributes: {slot} Sentence:"


def attribute_lines(attributes: str) -> str:
    """``key[value], ...`` as the authors' ``key -- value`` lines joined with ``",\\n"``."""
    return ",\n".join(f"{key} -- {value}" for key, value in ATTRIBUTE.findall(attributes))


def authors_input(dataset: str, source: str) -> str:
    """The example's source as the authors' prompts hold it (before any ``key -- value`` layout)."""
    if dataset == "webnlg":
        return "".join(f"{triple}\n" for triple in webnlg_triples(source))
    if dataset == "adidas":
        fields = adidas_attributes(source)
        return ", ".join(f"{AUTHORS_ADIDAS_KEYS[key]}[{fields[key] or 'None'}]" for key in ADIDAS_FIELDS)
    return source  # the E2E MR, the CommonGen concepts


def fill(dataset: str, family: str, source: str, style: str = "authors") -> str:
    """The prompt for one input, without demonstrations."""
    check_prompt_args(dataset, family, style)
    if style == "appendix":
        return template(dataset, family).replace(SLOTS[dataset], source)
    spec = AUTHORS_PROMPTS[dataset][family]
    text = authors_input(dataset, source)
    return spec.prefix + (attribute_lines(text) if spec.lines else text) + spec.suffix


def authors_context(dataset: str, family: str, demonstrations: Sequence[tuple[Example | str, str]]) -> str:
    """The authors' ICL context for these (example or source, reference) pairs; "" for none."""
    if not demonstrations:
        return ""
    layout = AUTHORS_DEMONSTRATIONS[dataset][family]
    instruction = AUTHORS_PROMPTS[dataset][family].prefix.split("\n\n")[0] + "\n\n"
    blocks = []
    for number, (demo, reference) in enumerate(demonstrations, start=1):
        prompt = fill(dataset, family, getattr(demo, "source", demo))
        if layout.drop_instruction:
            prompt = prompt[len(instruction):]
        blocks.append(layout.label.format(number=number) + prompt + layout.between + reference + layout.end)
    header, footer = AUTHORS_ICL_FRAMES[dataset] if layout.framed else ("", "")
    return header + "".join(blocks) + footer


def build_prompt(dataset: str, family: str, source: str,
                 demonstrations: Iterable[tuple[Example | str, str]] = (), style: str = "authors") -> str:
    """The prompt for ``source`` in ``style``, preceded by ICL demonstrations if any are given.

    ``demonstrations`` are (example or source, reference) pairs, e.g. from
    :func:`authors_demonstrations` or :func:`sample_demonstrations`.
    """
    query = fill(dataset, family, source, style)
    demonstrations = list(demonstrations)
    if style == "authors":
        return authors_context(dataset, family, demonstrations) + query
    blocks = [f"{fill(dataset, family, getattr(demo, 'source', demo), style)} {reference}"
              for demo, reference in demonstrations]
    return BLOCK_SEPARATOR.join([APPENDIX_ICL_HEADER, *blocks, query]) if blocks else query


def _refuse_test_examples(pool: Sequence[Example]) -> None:
    test_ids = [e.id for e in pool if e.meta.get("split") == "test"]
    if test_ids:
        raise ValueError(f"Demonstrations must not come from the test split; the pool holds "
                         f"{len(test_ids)} test examples (e.g. {test_ids[0]}).")


def authors_demonstrations(pool: Sequence[Example], k: int) -> list[tuple[Example, str]]:
    """The authors' ICL draw (``appendix`` style: :func:`sample_demonstrations`): ``k``
    (example, reference) rows of the pool, chosen as ``np.random.seed(42);
    np.random.choice(len(rows), k)`` chooses them, with replacement, from its rows in the
    authors' row order (``meta["rows"]``; a pool made without it: its own order). One draw
    serves every input and seed. Test-split examples are refused.
    """
    _refuse_test_examples(pool)
    rows = [(example, reference) for example in pool for reference in example.references]
    if all("rows" in example.meta for example in pool):
        positions = [position for example in pool for position in example.meta["rows"]]
        rows = [row for _, row in sorted(zip(positions, rows), key=lambda item: item[0])]
    if k < 0 or (k > 0 and not rows):
        raise ValueError(f"Cannot draw k={k} demonstrations from {len(rows)} rows.")
    if k == 0:
        return []
    chosen = np.random.RandomState(AUTHORS_DEMONSTRATION_SEED).choice(len(rows), k)
    return [rows[i] for i in chosen]


def sample_demonstrations(pool: Sequence[Example], k: int, seed: int,
                          exclude_ids: Iterable[str] = ()) -> list[tuple[Example, str]]:
    """The ``appendix`` draw: ``k`` distinct examples of the training pool, each with one of its
    references, drawn anew per input and seed. The same pool and seed give the same demonstrations. Examples whose id is in
    ``exclude_ids`` (e.g. the query itself) are skipped; test-split examples are refused.
    """
    _refuse_test_examples(pool)
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
