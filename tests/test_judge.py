"""Distribution-shift judges: word-list rules on hand sentences, their accuracy on dataset
references with known labels, and the GPT-4o judge's skip path and parsing (no network)."""
from __future__ import annotations

import json
import urllib.error

import pytest

from plugin_lib.analysis import judge

import real_data

@pytest.fixture
def needs_data():
    real_data.require("webnlg", "commongen")


@pytest.mark.parametrize("text, expected", [
    ("She was born in Paris.", True),
    ("Aleksandre Guruli played for FC Karpaty Lviv.", True),
    ("Alan Bean is an American astronaut.", True),
    ("Adirondack Regional Airport serves the city of Saranac Lake.", False),
    ("The leader of Birmingham is John Clancy, and the architect designed the tower.", False),
    ("", False),
])
def test_person_rule(text, expected):
    assert judge.is_person_related(text) is expected


@pytest.mark.parametrize("text, expected", [
    ("A woman rides a horse.", "woman"),
    ("WOMEN'S shoes are on sale.", "woman"),
    ("The girl throws her ball.", "woman"),
    ("The man walks his dog.", "man"),
    ("A man hands his wife a cup.", "both"),
    ("A dog runs across the field.", None),
    ("The manager opens the mandolin case.", None),  # whole words only
])
def test_gender_rule(text, expected):
    assert judge.gender_of(text) == expected


def test_shares_and_counts():
    texts = ["A woman sings.", "A boy jumps.", "A mother and her son cook.", "Trees grow."]
    result = judge.woman_judge(texts)
    assert (result.n_items, result.n_counted) == (4, 3)
    assert result.share == pytest.approx(2 / 3)  # the mixed text counts as woman-related
    assert result.details["share_excluding_mixed"] == pytest.approx(1 / 2)
    assert result.details["n_both"] == 1
    person = judge.person_judge(["He was born in Rome.", "The bridge is long."])
    assert (person.share, person.n_items, person.n_counted) == (0.5, 2, 2)
    assert judge.woman_judge(["Trees grow."]).share is None


def test_person_judge_on_webnlg_references(needs_data):
    scores, by_category = judge.validate_person_judge()
    assert scores["n"] > 3000 and scores["n_positive"] > 900
    assert scores["accuracy"] > 0.9 and scores["precision"] > 0.85 and scores["recall"] > 0.75
    infrastructure = by_category[~by_category["label"]]
    assert set(infrastructure["category"]) == {"Airport", "Building", "Monument", "University"}
    assert (infrastructure["judged_person"] < 0.1).all()


@pytest.mark.filterwarnings("ignore:CommonGen train")
def test_gender_judge_on_commongen_references(needs_data):
    scores = judge.validate_gender_judge()
    assert scores["n"] >= 40 and scores["accuracy"] > 0.9 and scores["gendered_recall"] > 0.9
    train = judge.man_train_check()  # every train reference says "man"
    assert train.n_counted == train.n_items > 500
    assert train.share < 0.2 and train.details["n_woman_only"] == 0


# ---------------------------------------------------------------------------------------------
# GPT-4o judge

class FakeTransport:
    """Records the request and answers with a canned chat-completions response."""

    def __init__(self, content=None, error=None):
        self.content, self.error, self.calls = content, error, []

    def __call__(self, url, headers, body):
        self.calls.append((url, headers, json.loads(body)))
        if self.error:
            raise self.error
        return json.dumps({"model": "gpt-4o-2024-08-06",
                           "choices": [{"message": {"content": self.content}}]}).encode()


def test_gpt4o_skips_without_a_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    transport = FakeTransport("Answer: 50%")
    result = judge.gpt4o_judge(["a", "b"], judge.PAPER_PERSON_QUESTION, transport=transport)
    assert result.status == judge.SKIPPED_NO_KEY and "OPENAI_API_KEY" in result.status
    assert result.share is None and result.n_items == 2 and not transport.calls


def test_gpt4o_request_and_parsing(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    transport = FakeTransport("Samples 1 and 3 are about people.\nAnswer: 66.67%")
    texts = ["Alan Bean was born in Texas.", "The airport\nserves Amsterdam.", "She sings."]
    result = judge.gpt4o_judge(texts, judge.PAPER_PERSON_QUESTION, transport=transport)
    assert result.status == "ok" and result.share == pytest.approx(0.6667)
    assert result.details["model"] == "gpt-4o-2024-08-06"
    (url, headers, body), = transport.calls
    assert url == judge.OPENAI_URL and headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "gpt-4o" and body["temperature"] == 0
    prompt = body["messages"][0]["content"]
    assert judge.PAPER_PERSON_QUESTION in prompt
    numbered = "1. Alan Bean was born in Texas.\n2. The airport serves Amsterdam.\n3. She sings."
    assert numbered in prompt  # one line per sample, line breaks inside a sample flattened


@pytest.mark.parametrize("transport, status", [
    (FakeTransport(error=urllib.error.URLError("no route")), "failed: "),
    (FakeTransport("I cannot tell."), "failed: no percentage"),
])
def test_gpt4o_failures_are_reported_not_raised(transport, status):
    result = judge.gpt4o_judge(["x"], judge.PAPER_WOMAN_QUESTION, api_key="k", transport=transport)
    assert result.status.startswith(status) and result.share is None


@pytest.mark.parametrize("reply, share", [
    ("About 18% at first glance.\nAnswer: 17.99 %", 0.1799),
    ("Roughly 40% of them.", 0.40),
    ("answer: 100%", 1.0),
    ("No idea.", None),
])
def test_parse_percentage(reply, share):
    assert judge.parse_percentage(reply) == (pytest.approx(share) if share is not None else None)
