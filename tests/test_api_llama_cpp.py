"""The HTTP black box against llama-cpp-python's real server on the offline GGUF: token keys and
their alignment, agreement with the in-process model, a stopped server, a tokenizer mismatch.
The real-server tests skip where llama-cpp-python's server is not installed
(``pip install -e ".[api]"``); the fake server's tests are in ``test_api.py``."""
from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList, PreTrainedTokenizerFast

from plugin_lib.core.api import ApiBlackBox
from plugin_lib.core.api_client import ApiUnavailable, TokenizerMismatch
from plugin_lib.core.token_keys import KeyMap, echo_entries, token_bytes, token_keys
from plugin_lib.core.decode import PluginLogitsProcessor, repetition_penalty_processor
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.harness import api_server, models
from plugin_lib.harness.api_server import LlamaCppServer
from api_helpers import K, PROMPTS, api_client
from real_data import require


@pytest.fixture(scope="module")
def local_tokenizer():
    """SmolLM2's tokenizer alone (the converted copy), as the API model's entry names it."""
    return models.api_tokenizer(models.model_spec("smollm2-135m-instruct-api"))


# ---------------------------------------------------------------- keys and alignment


def test_echo_alignments():
    bos = 1
    plain, chat = [5, 6, 7], [1, 5, 1, 6]
    # OpenAI: entry i is token i, drawn after ids[:i]; the generated token last.
    assert echo_entries(plain, "openai", bos) == [(0, 5), (1, 6), (2, 7), (3, None)]
    # llama-cpp-python without a leading BOS: shifted by one, no entry for the generated token.
    assert echo_entries(plain, "llama-cpp-python", bos) == [(1, 5), (2, 6), (3, 7)]
    # With a leading BOS: OpenAI's alignment, every BOS-id token dropped, the generated token last.
    assert echo_entries(chat, "llama-cpp-python", bos) == [(1, 5), (3, 6), (4, None)]


def test_colliding_keys_go_to_the_end_of_sequence_token_or_the_exact_one(local_tokenizer):
    pieces = token_bytes(local_tokenizer)
    exact = [b is not None and len(b) <= 32 and b.decode("utf-8", "ignore").encode() == b for b in pieces]
    key_map = KeyMap(token_keys(local_tokenizer, "llama-cpp-python", pieces), local_tokenizer.eos_token_id, exact)
    space = local_tokenizer.convert_tokens_to_ids("Ġ")
    assert key_map.ids[""] == local_tokenizer.eos_token_id  # every special token renders as ""
    assert key_map.ids[" "] == space  # byte fragments after a space render as " " too
    assert key_map.to_ids({"": -0.5, " ": -2.0, " the": -3.0}) == {
        local_tokenizer.eos_token_id: -0.5, space: -2.0, local_tokenizer.convert_tokens_to_ids("Ġthe"): -3.0}
    with pytest.raises(TokenizerMismatch):
        key_map.to_ids({"no such token key \x00": -1.0})


# ---------------------------------------------------------------- llama-cpp-python's real server

needs_llama_cpp = pytest.mark.skipif(api_server.llama_cpp_missing() is not None,
                                     reason=str(api_server.llama_cpp_missing()))


@pytest.fixture(scope="module")
def llama_server():
    if api_server.llama_cpp_missing():
        pytest.skip(api_server.llama_cpp_missing())
    with LlamaCppServer(n_threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def live_box(llama_server, local_tokenizer):
    return ApiBlackBox(api_client(llama_server.base_url, max_concurrency=1, timeout_s=300), local_tokenizer, K)


@needs_llama_cpp
def test_keys_are_llama_cpp_pythons_for_every_id(local_tokenizer):
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=str(models.gguf_path()), vocab_only=True, verbose=False)
    keys = token_keys(local_tokenizer, "llama-cpp-python")
    assert len(keys) == vocab.n_vocab() == len(local_tokenizer)
    assert keys == [vocab.detokenize([i]).decode("utf-8", errors="ignore") for i in range(len(keys))]


@needs_llama_cpp
@pytest.mark.slow
def test_live_server_alignment_matches_the_in_process_model(live_box, smollm2):
    """Stepwise teacher forcing through llama.cpp (Q4_1) against the in-process model (the same
    weights de-quantised to float32), at the target positions of a chat pair. Tolerance: the
    same most likely token at 80% of the positions at least, and a mean |difference| of at most
    0.2 nats over the top-k entries both report (quantisation: measured about 0.1); the echo
    alignment is llama-cpp-python's and the echoed rows agree with the stepwise ones within the
    server's own batch-size effect (mean 0.3 nats at most)."""
    assert live_box.key_style == "llama-cpp-python"
    assert live_box.detect_echo_alignment() == "llama-cpp-python"
    pair = encode_pairs(live_box.tokenizer, [PROMPTS[2]], ["Blue. The sky is blue on a clear day."])[0]
    ids, lengths = list(pair.input_ids), list(range(pair.prompt_length, len(pair.input_ids)))
    stepwise = torch.stack([live_box.next_token_log_probs(ids[:n], phase="teacher_forcing") for n in lengths])
    local = F.log_softmax(smollm2.logits(torch.tensor([ids]))[0].float(), dim=-1)
    aligned, shifted = local[[n - 1 for n in lengths]], local[lengths[:-1]]

    def closeness(api_rows, local_rows):
        top_api, top_local = api_rows.topk(K).indices, local_rows.topk(K).indices
        shared = (top_api[:, :, None] == top_local[:, None, :]).any(-1)
        diff = (api_rows.gather(1, top_api) - local_rows.gather(1, top_api)).abs()[shared]
        return (top_api[:, 0] == top_local[:, 0]).float().mean().item(), diff.mean().item()

    same_top, mean_diff = closeness(stepwise, aligned)
    assert same_top >= 0.8 and mean_diff <= 0.2
    assert closeness(stepwise[:-1], shifted)[0] < 0.5  # one position off is far off: the test can tell
    echoed = live_box.echo_log_probs(ids, lengths)
    assert sorted(echoed) == lengths
    assert closeness(torch.stack([echoed[n] for n in lengths]), stepwise)[1] <= 0.3


@needs_llama_cpp
@pytest.mark.parametrize("speculate", [1, 8])
def test_decoding_reproduces_the_servers_own_greedy_decoding(live_box, speculate):
    prompt = "The three primary colours are"  # no end of text within 8 tokens
    enc = live_box.tokenizer([prompt], return_tensors="pt")
    out = live_box.generate(enc.input_ids, enc.attention_mask, max_new_tokens=8, speculate=speculate,
                            logits_processor=LogitsProcessorList(), eos_token_id=live_box.eos_token_id)
    ours = live_box.tokenizer.decode(out[0, enc.input_ids.shape[1]:])
    # repeat_penalty: llama-cpp-python's own sampling penalises repeats by default (1.1).
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logit_bias": live_box._logit_bias,
            "repeat_penalty": 1.0}
    theirs = live_box.client.post("/v1/completions", body)["choices"][0]["text"]
    assert ours == theirs


def _greedy_ids(box, prompt, reweighter, speculate, max_new_tokens=24):
    """The ids ``core.decode.generate`` decodes for one prompt (repetition penalty 1.1)."""
    enc = box.tokenizer([prompt], return_tensors="pt")
    if reweighter is None:
        processors = [repetition_penalty_processor(1.1, enc.input_ids.shape[1])]
    else:
        processors = [PluginLogitsProcessor(reweighter, enc.attention_mask, repetition_penalty=1.1)]
    out = box.generate(enc.input_ids, enc.attention_mask, logits_processor=LogitsProcessorList(processors),
                       max_new_tokens=max_new_tokens, eos_token_id=box.eos_token_id, speculate=speculate)
    return out[0, enc.input_ids.shape[1]:].tolist()


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("reweighted", [True, False])
def test_speculative_decoding_on_the_live_server_gives_the_ids_of_one_request_per_token(
        live_box, small_reweighter, reweighted):
    """E2E test prompts as notebook 14 builds them (chat template), one at a time as it decodes
    them, the Plugin (a seeded reweighter) or the base alone, with the repetition penalty:
    the same token ids with 8 positions per request as with one request per token, in fewer
    requests than tokens."""
    from plugin_lib import data
    from plugin_lib.harness import tasks

    require("e2e")
    examples = data.load_dataset("e2e", "test", rows=4)
    task = tasks.Task(live_box, "e2e", "llama", train=[], hyper=[], test=examples, use_chat_template=True)
    reweighter = small_reweighter() if reweighted else None
    decoded, spent = {}, {}
    for speculate in (1, 8):
        before = live_box.usage.snapshot()
        decoded[speculate] = [_greedy_ids(live_box, task.prompt(ex), reweighter, speculate) for ex in examples]
        spent[speculate] = live_box.usage.minus(before).phases["decoding"]
    assert decoded[8] == decoded[1]
    assert spent[1].requests == spent[1].items == sum(map(len, decoded[1]))
    assert spent[8].items == spent[1].items and spent[8].requests == spent[8].items - spent[8].accepted
    assert spent[8].requests < spent[8].items
    if not reweighted:  # the server's argmax is the base's, apart from the penalty
        assert spent[8].requests <= 0.5 * spent[8].items


@needs_llama_cpp
def test_a_stopped_server_is_a_clear_error(local_tokenizer):
    with LlamaCppServer(n_threads=1) as server:
        box = ApiBlackBox(api_client(server.base_url, max_retries=1, timeout_s=60), local_tokenizer, 5)
    with pytest.raises(ApiUnavailable, match="Is the server running"):
        box.next_token_log_probs(local_tokenizer("Hello")["input_ids"])


@needs_llama_cpp
def test_a_server_that_dies_on_its_first_decode_is_refused_at_start_with_the_portable_build(tmp_path):
    """llama.cpp built for this machine's CPU (its default) loaded the model and then crashed with
    a segmentation fault on the first token (2026-12-06). Here the real server is killed with
    that signal once it has answered, as the crash left it: start says so, with the rebuild."""

    class CrashingAfterLoading(LlamaCppServer):
        def answers(self) -> bool:
            loaded = super().answers()
            if loaded:
                os.kill(self.process.pid, signal.SIGSEGV)
            return loaded

    server = CrashingAfterLoading(n_threads=1, log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match=r"failed to decode one token .*killed by signal 11.*portable build, "
                                           r"CMAKE_ARGS=.*-DGGML_NATIVE=OFF"):
        server.start()
    assert server.process.poll() is not None


def test_ci_and_the_docs_build_the_server_with_the_packages_portable_flags():
    """The portable build's flags are written in three places; a change to one is a change to all."""
    flags = api_server.PORTABLE_BUILD.split('"')[1]
    root = Path(__file__).resolve().parents[1]
    for where in (".ci/run", "docs/api.md"):
        assert flags in " ".join((root / where).read_text(encoding="utf-8").split()), where


@needs_llama_cpp
def test_another_tokenizer_is_refused_by_the_live_server(llama_server, local_tokenizer, tmp_path):
    """SmolLM2's tokenizer with two common tokens' ids swapped: a near miss is still found."""
    spec = json.loads(local_tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab["Ġthe"], vocab["Ġof"] = vocab["Ġof"], vocab["Ġthe"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    swapped = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                      eos_token=local_tokenizer.eos_token, bos_token=local_tokenizer.bos_token)
    with pytest.raises(TokenizerMismatch, match="not the server's"):
        ApiBlackBox(api_client(llama_server.base_url), swapped, K)


@needs_llama_cpp
def test_llama_cpp_has_no_k_limit_so_the_configuration_sets_one(llama_server, local_tokenizer):
    """llama.cpp accepts any k (up to the whole vocabulary): max_k is where a limit comes from."""
    box = ApiBlackBox(api_client(llama_server.base_url), local_tokenizer, 1000)
    assert (box.next_token_log_probs(local_tokenizer("Hello")["input_ids"]) > -math.inf).all()
    with pytest.raises(ValueError, match="limit of 20"):
        ApiBlackBox(api_client(llama_server.base_url), local_tokenizer, 21, max_k=20)
