"""The HTTP black box (``core.api``) against a fake OpenAI-compatible server serving the tiny
in-process base (``fake_openai_server.py``): exact comparisons with the in-process top-k view,
error handling, and runs through the API. Token keys and llama-cpp-python's real server:
``test_api_llama_cpp.py``."""
from __future__ import annotations

import json
import random
import threading
import time

import pytest
import torch

from plugin_lib.core.api import ApiBlackBox
from plugin_lib.core.api_client import ApiRequestError, ApiUnavailable, NoLogProbs, TokenizerMismatch
from plugin_lib.core.blackbox import TopKBlackBox, restrict_log_probs
from plugin_lib.core.decode import generate
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import collate, encode_pairs
from plugin_lib.harness import api_server, models
from api_helpers import K, PROMPTS, TARGETS, api_client
from fake_openai_server import fake  # noqa: F401 (the fixture)


def _pairs(tokenizer):
    return encode_pairs(tokenizer, PROMPTS, TARGETS)


# ---------------------------------------------------------------- the same numbers as the in-process view


@pytest.mark.parametrize("teacher_forcing", ["stepwise", "echo"])
def test_teacher_forcing_gives_the_in_process_views_rows(fake, tiny_base, teacher_forcing):
    """Exact keys (token ids), so the completed rows are the top-k view's, both ways."""
    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K, teacher_forcing=teacher_forcing)
    assert box.key_style == "token-ids"
    view = TopKBlackBox(tiny_base, K)
    pairs = _pairs(tiny_base.tokenizer)
    api_cache = BaseOutputCache.build(box, pairs, progress=False)
    view_cache = BaseOutputCache.build(view, pairs, progress=False)
    # float32: the fake server runs one sequence per request, the view a padded batch, so the
    # forwards round differently (up to 7e-5 nats seen under load); a row's residual mass, spread
    # over every token outside the top k, carries that difference to the whole row.
    torch.testing.assert_close(api_cache.get(range(3)), view_cache.get(range(3)), atol=2e-4, rtol=0)
    if teacher_forcing == "echo":
        assert box.detect_echo_alignment() == "openai"
    spent = box.usage.phases["teacher_forcing"]
    assert spent.items == 3 and spent.positions == sum(p.target_length for p in pairs)
    expected = spent.positions if teacher_forcing == "stepwise" else 3
    assert spent.requests == expected


def test_plugin_decoding_through_the_api_equals_the_in_process_view(fake, tiny_base, small_reweighter):
    server = fake()
    box = ApiBlackBox(api_client(server.url, max_concurrency=3), tiny_base.tokenizer, K)
    view = TopKBlackBox(tiny_base, K)
    reweighter = small_reweighter()
    settings = dict(max_new_tokens=6, repetition_penalty=1.1, progress=False, batch_size=3)
    assert generate(box, PROMPTS, reweighter, **settings) == generate(view, PROMPTS, reweighter, **settings)
    assert generate(box, PROMPTS, None, **settings) == generate(view, PROMPTS, None, **settings)
    decoding = box.usage.phases["decoding"]
    assert 0 < decoding.requests == decoding.items - decoding.accepted and decoding.retokenized == 0
    assert server.most_in_flight <= 3


@pytest.mark.parametrize("reweighted", [True, False])
def test_speculative_decoding_gives_the_outputs_of_one_request_per_token(fake, tiny_base, small_reweighter,
                                                                           reweighted):
    """Three rows at once, the Plugin's stateful processor and the repetition penalty: the same
    outputs as one request per token, in fewer requests; every step without a request used an
    accepted position. The random base strings tokens whose text tokenizes otherwise (the
    server then reads other ids: ``retokenized``): the outputs are the same there too."""
    server = fake()
    reweighter = small_reweighter() if reweighted else None
    settings = dict(max_new_tokens=12, repetition_penalty=1.1, progress=False, batch_size=3)
    outputs, spent = {}, {}
    for speculate in (1, 4, 16):
        box = ApiBlackBox(api_client(server.url, max_concurrency=3), tiny_base.tokenizer, K, speculate=speculate)
        outputs[speculate] = generate(box, PROMPTS, reweighter, **settings)
        spent[speculate] = box.usage.phases["decoding"]
    assert outputs[1] == outputs[4] == outputs[16]
    assert spent[1].requests == spent[1].items == spent[1].positions and spent[1].accepted == 0
    assert spent[1].retokenized > 0 or reweighted
    for speculate in (4, 16):
        used = spent[speculate]
        assert used.items == spent[1].items
        assert used.requests == used.items - used.accepted < spent[1].requests
        assert used.positions > used.items  # positions after a rejected token are received and not used
    asked = [b["max_tokens"] for b in server.bodies if b and "max_tokens" in b]
    speculative = [b for b in server.bodies if b and b.get("max_tokens", 1) > 1]
    assert max(asked) == 12 and all(b["repeat_penalty"] == 1.0 for b in speculative)


def test_sampling_asks_one_position_per_request(fake, tiny_base):
    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K, speculate=8)
    enc = tiny_base.tokenizer(PROMPTS[:1], return_tensors="pt")
    torch.manual_seed(0)
    box.generate(enc.input_ids, enc.attention_mask, max_new_tokens=5, do_sample=True, top_p=0.9)
    decoding = box.usage.phases["decoding"]
    assert decoding.requests == decoding.items == decoding.positions and decoding.accepted == 0
    assert {b["max_tokens"] for b in server.bodies[-decoding.requests:]} == {1}


def test_a_server_that_stops_early_or_drops_log_probabilities_is_asked_again(fake, tiny_base):
    """Fewer positions than asked, or one without top_logprobs: the rest is asked anew."""
    server = fake()
    full = server.complete
    short = iter([1, 2, 3])

    def stopping_early(body):
        answer = full(body)
        logprobs = answer["choices"][0]["logprobs"]
        if body.get("max_tokens", 1) > 1 and logprobs:
            kept = next(short, None)
            if kept is not None:
                logprobs["tokens"], logprobs["top_logprobs"] = logprobs["tokens"][:kept + 1], (
                    logprobs["top_logprobs"][:kept] + [None])  # then a position without log-probabilities
        return answer

    enc = tiny_base.tokenizer(PROMPTS[:1], return_tensors="pt")
    plain = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K, speculate=1)
    expected = plain.generate(enc.input_ids, enc.attention_mask, max_new_tokens=10)
    server.complete = stopping_early
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K, speculate=6)
    assert torch.equal(box.generate(enc.input_ids, enc.attention_mask, max_new_tokens=10), expected)
    decoding = box.usage.phases["decoding"]
    assert decoding.requests == decoding.items - decoding.accepted >= 4


def test_a_streamer_gets_the_prompt_then_each_token(fake, tiny_base):
    from transformers import TextIteratorStreamer

    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)
    enc = tiny_base.tokenizer(PROMPTS[:1], return_tensors="pt")
    streamer = TextIteratorStreamer(tiny_base.tokenizer, skip_prompt=True)
    out = box.generate(enc.input_ids, enc.attention_mask, max_new_tokens=8, streamer=streamer)
    streamed = "".join(streamer)  # end() was called: the iterator stops
    assert streamed == tiny_base.tokenizer.decode(out[0, enc.input_ids.shape[1]:])
    batch = tiny_base.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="one row"):
        box.generate(batch.input_ids, batch.attention_mask, streamer=TextIteratorStreamer(tiny_base.tokenizer))
    with pytest.raises(ValueError, match="speculate must be a positive integer"):
        box.generate(enc.input_ids, enc.attention_mask, speculate=0)


def test_logits_over_a_left_padded_batch_match_the_view(fake, tiny_base):
    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)
    batch = collate(_pairs(tiny_base.tokenizer), tiny_base.tokenizer.pad_token_id)
    api, view = box.logits(batch["input_ids"], batch["attention_mask"]), TopKBlackBox(tiny_base, K).logits(
        batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(api[real], view[real], atol=2e-5, rtol=0)
    assert torch.isfinite(api).all()  # padding positions hold a harmless uniform row


def test_the_completion_rule_is_the_views(fake, tiny_base):
    """renormalize as well: -inf outside the reported tokens, the reported ones renormalised."""
    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, 5, rule="renormalize")
    ids = tiny_base.tokenizer("Hello, my name is")["input_ids"]
    expected = restrict_log_probs(tiny_base.logits(torch.tensor([ids]))[0, -1], 5, "renormalize")
    got = box.next_token_log_probs(ids)
    assert torch.isneginf(got).sum() == got.numel() - 5
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)


# ---------------------------------------------------------------- robustness


def test_rate_limits_are_retried_with_backoff(fake, tiny_base):
    server = fake(script=[(429, {"error": {"message": "slow down"}}, [("Retry-After", "0")]),
                          (503, "", ())])
    client = api_client(server.url, max_retries=3)
    assert client.get("/v1/models") == {"data": [{"id": "fake"}]}
    assert server.requests == 3 and client.usage.phases["checks"].retries == 2


def test_a_rejected_request_is_not_retried(fake, tiny_base):
    """llama-cpp-python answers validation errors with HTTP 500 and a message: retrying cannot help."""
    message = "1 validation error: logprobs Input should be greater than or equal to 0"
    server = fake(script=[(500, {"error": {"message": message, "type": "internal_server_error"}}, ())])
    client = api_client(server.url, max_retries=5)
    with pytest.raises(ApiRequestError, match="greater than or equal") as err:
        client.post("/v1/completions", {"prompt": "x"})
    assert err.value.status == 500 and server.requests == 1


def test_persistent_server_errors_give_up_after_the_retries(fake, tiny_base):
    server = fake(script=[(502, "", ())] * 10)
    client = api_client(server.url, max_retries=2)
    with pytest.raises(ApiUnavailable, match="after 3 attempt"):
        client.get("/v1/models")
    assert server.requests == 3


def test_no_server_is_a_clear_error():
    client = api_client(f"http://127.0.0.1:{api_server.free_port()}", max_retries=1)
    started = time.perf_counter()
    with pytest.raises(ApiUnavailable, match="Is the server running"):
        client.get("/v1/models")
    assert time.perf_counter() - started < 5


def test_a_slow_server_times_out(fake, tiny_base):
    server = fake(delay=1.0)
    client = api_client(server.url, timeout_s=0.2, max_retries=0)
    with pytest.raises(ApiUnavailable, match="time-out 0.2 s"):
        client.get("/v1/models")


def test_concurrent_requests_are_capped(fake, tiny_base):
    server = fake(delay=0.1)
    client = api_client(server.url, max_concurrency=2)
    threads = [threading.Thread(target=client.get, args=("/v1/models",)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.requests == 8 and server.most_in_flight == 2


def test_retry_after_is_honoured(fake, tiny_base):
    """The server's Retry-After (1 s), not the client's backoff (0.01 s), sets the wait."""
    server = fake(script=[(503, "", [("Retry-After", "1")])])
    client = api_client(server.url, backoff_s=0.01)
    started = time.perf_counter()
    assert client.get("/v1/models") == {"data": [{"id": "fake"}]}
    assert time.perf_counter() - started >= 1.0 and server.requests == 2


def test_the_waits_are_the_backoff_schedule(fake, tiny_base, monkeypatch):
    """The waits tenacity takes are the schedule the client always had: backoff_s * 2**k capped
    at max_backoff_s, times a jitter in [0.5, 1), and the server's Retry-After where it gives
    one (here 0); each wait is counted as a retry."""
    server = fake(script=[(503, "", ())] * 3 + [(429, "", [("Retry-After", "0")]), (502, "", ())])
    waits = []
    main = threading.main_thread()  # the fake server's threads sleep too (its delay, 0 here)
    monkeypatch.setattr(time, "sleep", lambda s: waits.append(s) if threading.current_thread() is main else None)
    monkeypatch.setattr(random, "random", lambda: 0.5)  # the jitter's middle: x0.75
    client = api_client(server.url, max_retries=5, backoff_s=0.1, max_backoff_s=0.3)
    assert client.get("/v1/models") == {"data": [{"id": "fake"}]}
    assert waits == pytest.approx([0.075, 0.15, 0.225, 0.0, 0.225])
    assert server.requests == 6 and client.usage.phases["checks"].retries == 5
    assert client.usage.phases["checks"].requests == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_client_error_is_raised_at_once_with_its_status(fake, tiny_base, status):
    server = fake(script=[(status, {"error": {"message": "no such thing"}}, ())] * 3)
    client = api_client(server.url, max_retries=3)
    with pytest.raises(ApiRequestError, match=f"HTTP {status}: no such thing") as err:
        client.post("/v1/completions", {"prompt": "x"})
    assert err.value.status == status and server.requests == 1 and client.usage.phases["checks"].retries == 0


def test_a_redirect_is_not_followed(fake, tiny_base, monkeypatch):
    """Following it would send the key to another address: the error names the address instead."""
    monkeypatch.setenv("PLUGIN_API_KEY", "sk-test-redirect")
    server = fake(script=[(307, "", [("Location", "http://elsewhere.invalid/v1/models")])])
    with pytest.raises(ApiRequestError, match="redirects to 'http://elsewhere.invalid/v1/models'"):
        api_client(server.url).get("/v1/models")
    assert server.requests == 1


def test_the_connection_is_kept_and_reused(fake, tiny_base):
    server = fake()
    client = api_client(server.url)
    for _ in range(5):
        client.get("/v1/models")
    assert server.requests == 5 and len(set(server.client_ports)) == 1  # one TCP connection
    client.close()
    with pytest.raises(RuntimeError):  # httpx refuses a closed client
        client.get("/v1/models")


def test_the_api_key_is_read_at_each_request(fake, tiny_base, monkeypatch):
    server = fake()
    client = api_client(server.url)
    monkeypatch.delenv("PLUGIN_API_KEY", raising=False)
    client.get("/v1/models")
    monkeypatch.setenv("PLUGIN_API_KEY", "sk-rotated-1")
    client.get("/v1/models")
    assert "Authorization" not in server.headers_seen[0]
    assert server.headers_seen[1]["Authorization"] == "Bearer sk-rotated-1"


def test_the_api_key_comes_from_the_environment_and_is_kept_nowhere(fake, tiny_base, monkeypatch):
    secret = "sk-test-0123456789"
    monkeypatch.setenv("PLUGIN_API_KEY", secret)
    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)
    assert server.headers_seen[-1]["Authorization"] == f"Bearer {secret}"
    shown = repr(box) + repr(box.client) + json.dumps(box.usage.as_dict()) + str(vars(box.client)) + str(vars(box))
    assert secret not in shown


def test_k_above_the_configured_limit_is_refused_before_any_request(fake, tiny_base):
    server = fake()
    with pytest.raises(ValueError, match="above this server's limit of 5"):
        ApiBlackBox(api_client(server.url), tiny_base.tokenizer, 20, max_k=5)
    assert server.requests == 0


def test_a_server_that_caps_k_is_found_at_connection(fake, tiny_base):
    server = fake(cap_k=5)
    with pytest.raises(ApiRequestError, match="returned 5: its limit is lower"):
        ApiBlackBox(api_client(server.url), tiny_base.tokenizer, 20)


def test_an_answer_without_log_probabilities_is_a_clear_error(fake, tiny_base):
    server = fake(no_logprobs=True)
    with pytest.raises(NoLogProbs, match="top-k log-probabilities of every step"):
        ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)


def test_a_chat_only_endpoint_says_it_cannot_train(fake, tiny_base):
    server = fake(completions=False)
    with pytest.raises(ApiRequestError, match="cannot be trained"):
        ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)


def test_a_different_tokenizer_on_the_server_is_found_at_connection(fake, tiny_base):
    shifted = lambda text: [i + 1 for i in tiny_base.tokenizer(text, add_special_tokens=False)["input_ids"]]  # noqa: E731
    server = fake(tokenize=shifted)
    with pytest.raises(TokenizerMismatch, match="not the server's"):
        ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K)


def test_load_api_model_needs_an_address_and_a_k(monkeypatch):
    monkeypatch.delenv("PLUGIN_API_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="PLUGIN_API_BASE_URL"):
        models.load_api_model("smollm2-135m-instruct-api@top20")
    with pytest.raises(ValueError, match="@top<k>"):
        models.load_api_model("smollm2-135m-instruct-api", base_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="behind an HTTP API"):
        models.load_causal_lm("smollm2-135m-instruct-api")


# ---------------------------------------------------------------- runs through the API


def test_runs_record_what_they_asked_and_the_cache_is_asked_once(fake, tiny_base, tiny_profile, toy_example,
                                                                tmp_path):
    """The runner stores each run's requests; the base-output cache is built by the first
    trained run and read from disk by every later one (grid, seeds): no further requests."""
    from plugin_lib.harness import tasks
    from plugin_lib.harness.running import runner

    server = fake()
    box = ApiBlackBox(api_client(server.url), tiny_base.tokenizer, K, name="tiny-llama")
    task = tasks.Task(box, "e2e", "llama", train=[toy_example(i, "validation") for i in range(4)],
                        hyper=[toy_example(i, "validation") for i in range(4, 6)],
                        test=[toy_example(i, "test") for i in range(2)], cache_dir=tmp_path / "cache")
    zeroshot = runner.run_experiment(task, "Zeroshot", 0, tiny_profile, progress=False)
    first = runner.run_experiment(task, "Plugin", 0, tiny_profile, progress=False)
    second = runner.run_experiment(task, "Plugin", 1, tiny_profile, progress=False)
    pairs = len(task.encoded("train")) + len(task.encoded("hyper"))
    assert zeroshot["api_usage"]["teacher_forcing"]["requests"] == 0
    decoded = zeroshot["api_usage"]["decoding"]
    assert 0 < decoded["requests"] == decoded["items"] - decoded["accepted"]
    assert first["api_usage"]["teacher_forcing"]["items"] == pairs
    assert first["api_usage"]["teacher_forcing"]["requests"] == first["api_usage"]["teacher_forcing"]["positions"]
    assert second["api_usage"]["teacher_forcing"]["requests"] == 0  # the cache came from disk
    assert second["api_usage"]["decoding"]["requests"] > 0


def test_notebook_14_says_why_it_skips_without_a_server(monkeypatch, tmp_path):
    from plugin_lib.experiments import api
    from plugin_lib.harness.profile import load_profile

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(api_server, "llama_cpp_missing", lambda python=None: "llama-cpp-python is not installed")
    study = api.run_study(load_profile("smoke"))
    assert not study.ran and "not installed" in study.note
    assert api.save_tables(study) == {} and api.plot_study(study) is None
    assert api.summary_lines(study) == [study.note]
    assert not (tmp_path / "smoke" / "tables").exists()
    # What the report reads to say that the notebook ran and why it measured nothing.
    assert json.loads((tmp_path / "smoke" / "skipped" / "api_e2e.json").read_text()) == {
        "name": "api_e2e", "reason": "llama-cpp-python is not installed"}


def test_notebook_14s_table_keeps_the_papers_metric_order_for_runs_read_back():
    """A run read back from the store has its metrics in JSON's sorted order; the table keeps the
    paper's (BLEU, ROUGE-1, ROUGE-2, ROUGE-L, METEOR, CIDEr, NIST) either way."""
    from plugin_lib.experiments import api
    from plugin_lib.harness.profile import load_profile
    from plugin_lib.metrics import METRIC_NAMES

    def run(method, predictions):
        scores = {name: float(i) for i, name in enumerate(METRIC_NAMES)}
        return {"method": method, "seed": 0, "predictions": predictions, "metrics": dict(sorted(scores.items()))}

    study = api.Study(load_profile("smoke"), "e2e", "", api_records=[run("Plugin", ["a", "b"])],
                      local_records=[run("Plugin", ["a", "c"])])
    table = api.metrics_table(study)
    assert list(table.columns) == ["method", "seed", "base", *METRIC_NAMES, "same output as the other"]
    assert table["BLEU"].tolist() == [0.0, 0.0] and table["NIST"].tolist() == [6.0, 6.0]
    assert table["same output as the other"].tolist() == [0.5, 0.5]
