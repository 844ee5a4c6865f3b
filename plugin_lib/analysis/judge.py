"""Judges for the distribution-shift study (section "Qualitative Analysis and Case Study",
paragraph "Plugin adapting to distribution shift").

The paper asked GPT-4o, over all outputs of a model, two questions (Appendix, quoted
verbatim in ``PAPER_PERSON_QUESTION`` and ``PAPER_WOMAN_QUESTION``):

- WebNLG: "Focus on all the samples, how much percentage is related to "Person"?"
  (fine-tuned base 17.99%, Plugin 71.34%);
- CommonGen: "Focus on those samples whose target is related to gender, how much percentage
  is related to "woman"?" (fine-tuned base 10.37%, Plugin 31.92%).

Offline, this module answers them with word lists (``person_judge``, ``woman_judge``); words
are the lowercase runs of ASCII letters of a text, so "woman's" gives "woman" and "s".

- Person: a text is Person-related when it has at least one ``PERSON_WORDS`` entry: personal
  pronouns, biography and career words (born, died, married, played, signed, club, ...),
  occupations a person is described by (singer, footballer, astronaut, ...) and titles (Mr,
  Sir, ...). Office titles that infrastructure texts attach to a building's, a university's
  or a city's people (president, leader, mayor, architect, dean, Dr, ...) are left out. The
  share is over all texts. On WebNLG references (all splits) it reaches about 0.92
  accuracy, 0.91 precision and 0.79 recall; SportsTeam texts, about clubs rather than
  people, are the main misses (see ``validate_person_judge``).
- Gender: a text is gendered when it has a ``WOMAN_WORDS`` or a ``MAN_WORDS`` entry; it is
  woman-related when it has a ``WOMAN_WORDS`` entry, including texts with both ("a man and
  his wife" relates to a woman). The share is over gendered texts; the result's details
  also give the share with mixed texts left out.

``validate_person_judge`` and ``validate_gender_judge`` measure the word lists on dataset
references whose label is known. ``gpt4o_judge`` asks GPT-4o the paper's question when
``OPENAI_API_KEY`` is set, and otherwise returns a "skipped" result instead of failing.
"""
from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from .. import data
from ..data.datasets import WEBNLG_EVAL_CATEGORIES

PAPER_PERSON_QUESTION = 'Focus on all the samples, how much percentage is related to "Person"?'
PAPER_WOMAN_QUESTION = ('Focus on those samples whose target is related to gender, how much '
                        'percentage is related to "woman"?')

PERSON_WORDS = frozenset("""
he she him his her hers himself herself
born birth birthplace died death buried married marriage spouse wife husband widow widower
son daughter sons daughters parents nationality alma graduated retired career
play plays played signed worked awarded award recipient succeeded club band manager commander
deputy
mr mrs ms sir lady lord king queen prince princess
actor actress singer songwriter musician guitarist drummer bassist pianist rapper composer
artist painter writer author poet novelist journalist comedian
politician senator congressman congresswoman diplomat statesman
athlete player footballer striker midfielder defender goalkeeper coach teammate
astronaut cosmonaut pilot crew
character superhero creator cartoonist illustrator
""".split())

WOMAN_WORDS = frozenset("""
woman women she her hers herself girl girls lady ladies female females
mother mothers mom moms mum mums mommy grandmother grandma daughter daughters sister sisters
aunt niece wife wives bride girlfriend fiancee queen princess actress waitress
mrs ms madam businesswoman policewoman sportswoman chairwoman
""".split())

MAN_WORDS = frozenset("""
man men he him his himself boy boys gentleman gentlemen guy guys male males
father fathers dad dads daddy grandfather grandpa son sons brother brothers
uncle nephew husband husbands groom boyfriend fiance king prince waiter
mr sir businessman policeman fireman sportsman chairman
""".split())

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
SKIPPED_NO_KEY = "skipped: set OPENAI_API_KEY to ask GPT-4o"

# (url, headers, body) -> response body; tests pass a fake one.
Transport = Callable[[str, dict[str, str], bytes], bytes]


@dataclass(frozen=True)
class JudgeResult:
    """``share`` of the ``n_counted`` texts (of ``n_items``) that the judge counted.

    ``share`` and ``n_counted`` are None when nothing could be counted or the judge did not
    run; ``status`` then says why ("skipped: ..." or "failed: ...").
    """

    share: float | None
    n_items: int
    n_counted: int | None
    judge: str
    status: str = "ok"
    details: dict = field(default_factory=dict)


def words_of(text: str) -> list[str]:
    """Lowercase runs of ASCII letters: the unit every word list is matched against."""
    return re.findall(r"[a-z]+", text.lower())


def is_person_related(text: str) -> bool:
    """True when ``text`` has at least one word of ``PERSON_WORDS``."""
    return not PERSON_WORDS.isdisjoint(words_of(text))


def gender_of(text: str) -> str | None:
    """``"woman"``, ``"man"``, ``"both"`` or None (no gender word) for one text."""
    words = set(words_of(text))
    woman, man = not WOMAN_WORDS.isdisjoint(words), not MAN_WORDS.isdisjoint(words)
    if woman and man:
        return "both"
    return "woman" if woman else "man" if man else None


def person_judge(texts: Sequence[str]) -> JudgeResult:
    """Share of ``texts`` that are Person-related (word-list judge)."""
    person = sum(map(is_person_related, texts))
    return JudgeResult(share=person / len(texts) if texts else None, n_items=len(texts),
                       n_counted=len(texts), judge="person word list",
                       details={"n_person": person})


def woman_judge(texts: Sequence[str]) -> JudgeResult:
    """Among gendered ``texts``, the share that is woman-related (mixed texts included)."""
    genders = [gender_of(text) for text in texts]
    counts = {g: genders.count(g) for g in ("woman", "man", "both")}
    gendered = sum(counts.values())
    unmixed = counts["woman"] + counts["man"]
    return JudgeResult(
        share=(counts["woman"] + counts["both"]) / gendered if gendered else None,
        n_items=len(texts), n_counted=gendered, judge="gender word lists",
        details={"n_woman_only": counts["woman"], "n_man_only": counts["man"],
                 "n_both": counts["both"],
                 "share_excluding_mixed": counts["woman"] / unmixed if unmixed else None})


# ---------------------------------------------------------------------------------------------
# Validation on references whose label is known.

def _distinct_references(example: data.Example) -> list[str]:
    return list(dict.fromkeys(example.references))


def _binary_scores(truth: Sequence[bool], predicted: Sequence[bool]) -> dict[str, float]:
    tp = sum(t and p for t, p in zip(truth, predicted))
    fp = sum(p and not t for t, p in zip(truth, predicted))
    fn = sum(t and not p for t, p in zip(truth, predicted))
    correct = sum(t == p for t, p in zip(truth, predicted))
    return {"n": len(truth), "n_positive": sum(truth), "accuracy": correct / len(truth),
            "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": tp / (tp + fn) if tp + fn else float("nan")}


def validate_person_judge(examples: Iterable[data.Example] | None = None
                          ) -> tuple[dict[str, float], pd.DataFrame]:
    """The Person judge against WebNLG categories: (scores, per-category table).

    Label: Person for the evaluation categories (validation/test: Artist, Politician,
    Athlete, ComicsCharacter, Astronaut, SportsTeam), not Person for the infrastructure
    categories of train. Every distinct reference of an input is one text. Default examples:
    all three splits. Note SportsTeam texts describe clubs, not people; the scores are also
    given without them (``*_without_sportsteam``).
    """
    if examples is None:
        examples = [e for split in data.SPLITS["webnlg"]
                    for e in data.load_dataset("webnlg", split)]
    rows = [{"category": e.meta["category"],
             "label": e.meta["category"] in WEBNLG_EVAL_CATEGORIES,
             "predicted": is_person_related(text)}
            for e in examples for text in _distinct_references(e)]
    table = pd.DataFrame(rows)
    scores = _binary_scores(table["label"].tolist(), table["predicted"].tolist())
    no_teams = table[table["category"] != "SportsTeam"]
    no_team_scores = _binary_scores(no_teams["label"].tolist(), no_teams["predicted"].tolist())
    scores.update({f"{key}_without_sportsteam": value for key, value in no_team_scores.items()})
    by_category = (table.groupby(["category", "label"])["predicted"]
                   .agg(n="size", judged_person="mean").reset_index()
                   .sort_values(["label", "category"], ascending=[False, True], ignore_index=True))
    return scores, by_category


def validate_gender_judge(examples: Iterable[data.Example] | None = None) -> dict[str, float]:
    """The gender judge on CommonGen references whose gender the concepts give away.

    Label: an input whose concepts contain words of one gender's list only (e.g. "lady",
    "groom") has references of that gender. Scores per distinct reference: how many are
    judged gendered (recall), and how many get the concepts' gender (woman-related for a
    woman label, man-only for a man label). Default examples: validation and test. This is
    a check of the word lists' coverage and inflections, not an independent gold standard.
    """
    if examples is None:
        examples = [e for split in ("validation", "test")
                    for e in data.load_dataset("commongen", split)]
    truth, judged = [], []
    for example in examples:
        concepts = set(example.meta["concepts"])
        woman, man = not WOMAN_WORDS.isdisjoint(concepts), not MAN_WORDS.isdisjoint(concepts)
        if woman == man:
            continue
        for text in _distinct_references(example):
            truth.append("woman" if woman else "man")
            judged.append(gender_of(text))
    matches = [(t == "woman" and j in ("woman", "both")) or (t == "man" and j == "man")
               for t, j in zip(truth, judged)]
    n = len(truth)
    return {"n": n, "n_woman_label": truth.count("woman"),
            "gendered_recall": sum(j is not None for j in judged) / n if n else float("nan"),
            "accuracy": sum(matches) / n if n else float("nan")}


def man_train_check(examples: Iterable[data.Example] | None = None) -> JudgeResult:
    """:func:`woman_judge` on CommonGen train references, which all say "man" by construction.

    Expect every text to be gendered; its woman share is the rate of mixed texts.
    """
    if examples is None:
        examples = data.load_dataset("commongen", "train")
    return woman_judge([text for e in examples for text in _distinct_references(e)])


# ---------------------------------------------------------------------------------------------
# GPT-4o, as in the paper (optional: needs OPENAI_API_KEY and network access).

def gpt4o_messages(texts: Sequence[str], question: str) -> list[dict[str, str]]:
    """The chat message: the numbered samples, the paper's question, and an answer format."""
    samples = "\n".join(f"{i}. {' '.join(text.split())}" for i, text in enumerate(texts, 1))
    return [{"role": "user", "content":
             f"Here are {len(texts)} samples, one per line:\n{samples}\n\n{question}\n"
             "End your answer with a line of the form 'Answer: <number>%'."}]


def parse_percentage(reply: str) -> float | None:
    """The share (0-1) in GPT-4o's reply: its 'Answer: N%' line, else its last 'N%'."""
    answer = re.search(r"Answer:\s*([0-9]+(?:\.[0-9]+)?)\s*%", reply, flags=re.IGNORECASE)
    found = [answer.group(1)] if answer else re.findall(r"([0-9]+(?:\.[0-9]+)?)\s*%", reply)
    return float(found[-1]) / 100 if found else None


def urllib_transport(url: str, headers: dict[str, str], body: bytes,
                     timeout: float = 300.0) -> bytes:
    """POST ``body`` to ``url`` with the standard library; returns the response body."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def gpt4o_judge(texts: Sequence[str], question: str, api_key: str | None = None, *,
                model: str = "gpt-4o", transport: Transport | None = None) -> JudgeResult:
    """Ask GPT-4o the paper's ``question`` about all ``texts`` at once, as the authors did.

    Without a key (argument or ``OPENAI_API_KEY``) nothing is sent and the result's status is
    ``SKIPPED_NO_KEY``; a network or API error, or a reply without a percentage, gives a
    "failed: ..." status. Neither raises, so a notebook can show the status and go on.
    """
    key = api_key or os.environ.get("OPENAI_API_KEY")
    judge = f"{model} (paper's question)"
    if not key:
        return JudgeResult(None, len(texts), None, judge, status=SKIPPED_NO_KEY)
    body = json.dumps({"model": model, "temperature": 0,
                       "messages": gpt4o_messages(texts, question)}).encode("utf-8")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        response = json.loads((transport or urllib_transport)(OPENAI_URL, headers, body))
        reply = response["choices"][0]["message"]["content"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:  # OSError: URLError
        return JudgeResult(None, len(texts), None, judge, status=f"failed: {err!r}")
    share = parse_percentage(reply)
    status = "ok" if share is not None else "failed: no percentage in the reply"
    return JudgeResult(share, len(texts), None, judge, status=status,
                       details={"reply": reply, "model": response.get("model", model)})
