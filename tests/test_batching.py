"""Continuous batching (issue 44): requests that join and leave a running batch at token
boundaries decode, greedily, exactly what each decodes alone through ``PluginModel.complete``;
each keeps its own sampling and its own cancellation."""
from __future__ import annotations

import time

import pytest

from plugin_lib.serving.batching import BatchEngine, Request
from test_serving import plugin  # noqa: F401 - the fixture

PROMPTS = ["Name a colour.", "Write one sentence about a restaurant: name[Cotto], food[Indian], area[riverside]",
           "What is the capital of France?", "Count to five."]


def _ids(adapted, prompt: str) -> list[int]:
    return adapted.tokenizer(adapted.format_prompt(prompt), add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def alone(plugin):  # noqa: F811
    """Each prompt decoded on its own (transformers' generate with the Plugin's processor)."""
    done = [plugin.complete(plugin.format_prompt(p), max_new_tokens=16) for p in PROMPTS]
    return [_ids(plugin, p) for p in PROMPTS], done


def _engine(adapted, max_batch: int = 8) -> BatchEngine:
    return BatchEngine(adapted.base, adapted.reweighter, eos_token_id=adapted.base.eos_token_id,
                       repetition_penalty=adapted.decoding.repetition_penalty, max_batch=max_batch)


def test_requests_joining_and_leaving_decode_what_each_decodes_alone(plugin, alone):  # noqa: F811
    prompts, expected = alone
    engine = _engine(plugin)
    first = [engine.submit(Request(prompts[i], 16)) for i in (0, 1)]
    while engine.steps < 3:  # the others join a batch already decoding
        time.sleep(0.01)
    later = [engine.submit(Request(prompts[i], 16 if i == 2 else 5)) for i in (2, 3)]
    results = [f.result(timeout=300) for f in first + later]
    engine.close()
    for (ids, reason), done, limit in zip(results, expected, (16, 16, 16, 5)):
        text = plugin.tokenizer.decode(ids, skip_special_tokens=True)
        if limit == 16:
            assert (text, len(ids), reason) == (done.text, done.completion_tokens, done.finish_reason)
        else:  # the same start, cut at its own max_new_tokens
            assert done.text.startswith(text) and len(ids) <= 5
    assert engine.steps < sum(len(ids) for ids, _ in results)  # they shared steps


def test_a_cancelled_request_leaves_and_the_batch_goes_on(plugin, alone):  # noqa: F811
    prompts, expected = alone
    engine = _engine(plugin, max_batch=2)
    dropped = Request(prompts[1], 200, temperature=2.0, seed=0)
    kept = engine.submit(Request(prompts[0], 16))
    engine.submit(dropped)
    queued = engine.submit(Request(prompts[2], 16))  # waits: the batch holds two
    while len(dropped.generated) < 3:
        time.sleep(0.01)
    dropped.cancel.set()
    assert dropped.done.result(timeout=60)[1] == "cancelled" and len(dropped.generated) < 200
    assert plugin.tokenizer.decode(kept.result(timeout=300)[0], skip_special_tokens=True) == expected[0].text
    assert plugin.tokenizer.decode(queued.result(timeout=300)[0], skip_special_tokens=True) == expected[2].text
    engine.close()


def test_a_seeded_sample_does_not_depend_on_its_batch(plugin, alone):  # noqa: F811
    prompts, _ = alone
    engine = _engine(plugin)
    solo = engine.submit(Request(prompts[3], 12, temperature=0.8, top_p=0.9, seed=7)).result(timeout=300)
    crowd = [engine.submit(Request(p, 12, temperature=0.8, top_p=0.9, seed=7 if i == 3 else i))
             for i, p in enumerate(prompts)]
    assert crowd[3].result(timeout=300) == solo
    engine.close()
