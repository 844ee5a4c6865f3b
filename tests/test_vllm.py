"""The Plugin inside vLLM (issue 74): greedy tokens equal to the package's own decoding, requests
that join and leave mid-batch, opt-out to the base alone, and `--engine vllm` for serve, generate
and evaluate. vLLM runs in its own environment (scripts/bootstrap_vllm.sh); without it these tests
skip in one line, and CI (PLUGIN_REQUIRE_VLLM=1) fails instead."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from transformers import LogitsProcessorList

from plugin_lib.core.combine import combine_log_probs
from plugin_lib.core.decode import PluginLogitsProcessor, repetition_penalty_processor
from plugin_lib.core.reweighter import make_reweighter, reweighter_logits
from plugin_lib.harness.api_server import free_port
from plugin_lib.serving import vllm_engine
from plugin_lib.serving.artifact import BaseSpec, DecodingSettings, PluginModel

PROMPTS = ["Write one sentence about a restaurant: name[Cotto], food[Indian], area[riverside]", "Name a colour.",
           "Describe a cat in a few words.", "What is two plus two?", "Write a haiku about rain.", "List three fruits.",
           "Tell me about Paris.", "Give a word that rhymes with light."]
NEW_TOKENS = 32
# float32 logits from two engines' kernels (vLLM's CPU attention and GEMMs against transformers'):
# where the Plugin's top two tokens are closer than this, either may win
TIE_MARGIN = 1e-4


def _vllm_ready() -> bool:
    if (vllm_engine.venv() / "bin" / "python").exists():
        return True
    if os.environ.get("PLUGIN_REQUIRE_VLLM") == "1":
        pytest.fail(f"PLUGIN_REQUIRE_VLLM=1 but vLLM's environment is missing ({vllm_engine.venv()}): "
                    f"{vllm_engine.INSTALL}")
    return False


needs_vllm = pytest.mark.skipif("not _vllm_ready()",
                                reason=f"vLLM's environment is not built here: {vllm_engine.INSTALL} (CI builds it)")


@pytest.fixture(scope="module")
def artifact(smollm2, tmp_path_factory):
    """SmolLM2 with a seeded reweighting model whose head is scaled so that it changes tokens;
    plain prompts, the package's repetition penalty."""
    reweighter = make_reweighter("llama", smollm2.vocab_size, seed=0)
    with torch.no_grad():
        reweighter.get_output_embeddings().weight.mul_(10.0)
    plugin = PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"),
                         decoding=DecodingSettings(max_new_tokens=NEW_TOKENS, repetition_penalty=1.1))
    return plugin, plugin.save_pretrained(tmp_path_factory.mktemp("vllm") / "art")


def _package_ids(plugin: PluginModel, ids: list[int], *, with_plugin: bool, penalty: float | None) -> list[int]:
    """The package's greedy tokens for one prompt, decoded as ``core.decode.generate`` decodes them:
    KV caches and the Plugin's logits processor (whose tokens equal the uncached loop's:
    tests/test_decode.py), one prompt at a time so that no padding enters."""
    prompt = torch.tensor([ids])
    mask = torch.ones_like(prompt)
    if with_plugin:
        processors = [PluginLogitsProcessor(plugin.reweighter, mask, repetition_penalty=penalty)]
    else:
        processors = [p for p in [repetition_penalty_processor(penalty, len(ids))] if p is not None]
    eos = plugin.base.eos_token_id
    out = plugin.base.generate(prompt, mask, logits_processor=LogitsProcessorList(processors), do_sample=False,
                               max_new_tokens=NEW_TOKENS, pad_token_id=plugin.tokenizer.pad_token_id,
                               eos_token_id=eos)[0, len(ids):].tolist()
    return out[: out.index(eos) + 1] if eos in out else out


def _margin(plugin: PluginModel, prefix: list[int], prompt_length: int, *, with_plugin: bool, penalty) -> float:
    """The package's top-2 margin (log-probabilities) after ``prefix``: how close the choice was."""
    ids = torch.tensor([prefix])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        scores = plugin.base.logits(ids, mask)[:, -1].float()
        processor = repetition_penalty_processor(penalty, prompt_length)
        if with_plugin:
            r = reweighter_logits(plugin.reweighter, ids, mask)[:, -1]
            if processor is not None:
                scores, r = processor(ids, scores), processor(ids, r)
            scores = combine_log_probs(scores, r)
        elif processor is not None:
            scores = processor(ids, scores)
    top = scores[0].log_softmax(-1).topk(2).values
    return float(top[0] - top[1])


@needs_vllm
def test_greedy_tokens_inside_vllm_are_the_packages_and_requests_keep_their_own_state(artifact):
    plugin, folder = artifact
    ids, _ = vllm_engine.prompt_ids(folder, PROMPTS)
    arms = {"plugin": {}, "base": {"plugin": 0}, "plugin, no penalty": {"plugin_repetition_penalty": 1},
            "base, no penalty": {"plugin": "off", "plugin_repetition_penalty": 1},
            # one batch mixing Plugin requests and opted-out ones
            "mixed": [{} if i % 2 == 0 else {"plugin": 0} for i in range(len(PROMPTS))]}
    checked = (("plugin", True, 1.1), ("base", False, 1.1), ("plugin, no penalty", True, None),
               ("base, no penalty", False, None))
    with ThreadPoolExecutor(1) as engine:  # vLLM decodes in its own process while the package decodes here
        # 4 slots for 8 prompts of different lengths that stop at different steps: requests join and leave mid-batch
        pending = engine.submit(vllm_engine.generate_ids, folder, ids, arms, max_new_tokens=NEW_TOKENS,
                                max_concurrency=4)
        wanted = {arm: [_package_ids(plugin, prompt, with_plugin=with_plugin, penalty=penalty) for prompt in ids]
                  for arm, with_plugin, penalty in checked}
        found = pending.result()
    close_calls, compared = [], 0
    for arm, with_plugin, penalty in checked:
        for n, (prompt, got, want) in enumerate(zip(ids, found[arm], wanted[arm])):
            compared += 1
            if got == want:
                continue
            k = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            margin = _margin(plugin, prompt + want[:k], len(prompt), with_plugin=with_plugin, penalty=penalty)
            assert margin <= TIE_MARGIN, (f"{arm}, prompt {n}: vLLM's token {k} differs from the package's with a top-2 "
                                          f"margin of {margin:.2e}, over {TIE_MARGIN}: {got[k:k + 4]} vs {want[k:k + 4]}")
            close_calls.append(f"{arm}, prompt {n}, token {k} (margin {margin:.1e})")
    if close_calls:
        warnings.warn(f"vLLM and the package differ at near-ties only: {'; '.join(close_calls)}")
    assert compared == 4 * len(PROMPTS) and len(close_calls) <= 2
    assert found["plugin"] != found["base"]  # the reweighting model changes tokens
    expected = [found["plugin"][i] if i % 2 == 0 else found["base"][i] for i in range(len(PROMPTS))]
    assert found["mixed"] == expected


def _wait_for(url: str, process: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"vLLM's server exited ({process.returncode})"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError("vLLM's server did not answer /health in time")


def _running(url: str) -> float:
    """vLLM's requests running now (its Prometheus gauge, summed over labels)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:num_requests_running"))


@needs_vllm
def test_serve_with_vllm_answers_the_openai_client_with_the_plugin_its_key_metrics_and_cancellation(artifact, tmp_path):
    plugin, folder = artifact
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "plugin_lib", "serve", "--plugin", str(folder), "--engine", "vllm",
                               "--port", str(port), "--name", "mine", "--api-key", "sk-test", "--max-concurrency", "4"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(url, server)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0, timeout=300)
        answer = client.completions.create(model="mine", prompt=PROMPTS[1], max_tokens=16, temperature=0)
        assert answer.choices[0].text.strip() == plugin.generate([PROMPTS[1]], max_new_tokens=16)[0]
        alone = client.completions.create(model="mine", prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                          extra_body={"vllm_xargs": {"plugin": 0}})
        assert alone.choices[0].text != answer.choices[0].text
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="sk-wrong").models.list()
        assert "vllm:" in httpx.get(f"{url}/metrics", timeout=10).text
        # a client that goes away mid-stream: vLLM aborts its request, long before its 400 tokens
        stream = client.completions.create(model="mine", prompt=PROMPTS[0], max_tokens=400, stream=True,
                                           extra_body={"min_tokens": 400})
        next(iter(stream))
        stream.close()
        deadline = time.monotonic() + 8  # 400 tokens take 20 s and more here
        while _running(url) > 0:
            assert time.monotonic() < deadline, "the dropped stream's request still runs"
            time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
        log.close()
    assert server.returncode is not None


@needs_vllm
def test_generate_and_evaluate_decode_in_vllm_from_the_command_line(artifact, tmp_path):
    plugin, folder = artifact
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "completion": "a short answer"}) + "\n" for p in PROMPTS[:3]))
    generated = subprocess.run([sys.executable, "-m", "plugin_lib", "generate", "--plugin", str(folder), "--file",
                                str(pairs), "--engine", "vllm"], capture_output=True, text=True, timeout=900)
    assert generated.returncode == 0, generated.stderr[-2000:]
    rows = [json.loads(line) for line in generated.stdout.splitlines()]
    assert [r["completion"] for r in rows] == plugin.generate(PROMPTS[:3])
    scored = subprocess.run([sys.executable, "-m", "plugin_lib", "evaluate", "--plugin", str(folder), "--data", str(pairs),
                             "--engine", "vllm", "--resamples", "100", "--no-card"],
                            capture_output=True, text=True, timeout=900)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "Both decoded in vllm" in scored.stdout and "| BLEU |" in scored.stdout


def test_without_vllm_the_engine_is_one_line_that_says_how_to_install_it(artifact, tmp_path, monkeypatch):
    _, folder = artifact
    env = {**os.environ, "PLUGIN_VLLM_VENV": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "plugin_lib", "generate", "--plugin", str(folder), "--prompt", "Hi",
                           "--engine", "vllm"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "vLLM is not installed" in done.stderr and vllm_engine.INSTALL in done.stderr


def test_the_package_engines_options_are_refused_with_vllm(artifact):
    _, folder = artifact
    for extra in (["--head-dtype", "float16"], ["--base-url", "http://127.0.0.1:1"], ["--engine", "tgi"]):
        done = subprocess.run([sys.executable, "-m", "plugin_lib", "generate", "--plugin", str(folder), "--prompt", "Hi",
                               "--engine", "vllm", *extra], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stderr.startswith("plugin-repro: error:"), done.stderr
