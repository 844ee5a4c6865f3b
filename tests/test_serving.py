"""A Plugin shipped and served (``plugin_lib.serving``): the artifact round-trips, the command
line trains and generates from a small JSONL and refuses bad input in one line, and the
OpenAI-compatible endpoint answers the official ``openai`` client over an in-process base and
over a real upstream (llama-cpp-python's server; those tests skip where it is not installed)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
import torch
from typer.testing import CliRunner

from plugin_lib.core.api import ApiBlackBox
from plugin_lib.core.api_client import CompletionsClient, TokenizerMismatch
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.harness import api_server, models
from plugin_lib.harness.api_server import LlamaCppServer, free_port
from plugin_lib.serving import cli
from plugin_lib.serving.artifact import ArtifactError, BaseSpec, Completion, DecodingSettings, PluginModel, read_config
from plugin_lib.serving.completions import CompletionService, StopScanner
from plugin_lib.serving.protocol import CompletionRequest, OpenAIError
from plugin_lib.serving.server import GracefulServer, Limits, create_app
from plugin_lib.serving.inputs import DataFileError, read_pairs

PAIRS = Path(__file__).parent / "fixtures" / "pairs.jsonl"
ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write one sentence about a restaurant: name[Cotto], food[Indian], area[riverside]"
CHAT = DecodingSettings(max_new_tokens=12, prompt_format="chat")
needs_llama_cpp = pytest.mark.skipif(api_server.llama_cpp_missing() is not None,
                                     reason=api_server.llama_cpp_missing() or "")


@pytest.fixture(scope="module")
def plugin(smollm2):
    """SmolLM2 with a seeded random reweighting model whose logits are spread, so that the
    Plugin's choices differ from the base's."""
    reweighter = make_reweighter("llama", smollm2.vocab_size, hidden_size=32, intermediate_size=64, seed=3)
    with torch.no_grad():
        reweighter.get_output_embeddings().weight.mul_(8.0)
    return PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"), decoding=CHAT,
                       training={"pairs": 3, "hparams": {"lr": 1e-3}, "val_loss": 1.5, "best_epoch": 2})


# ---------------------------------------------------------------- the artifact


def test_the_artifact_round_trips_with_identical_outputs(plugin, smollm2, tmp_path):
    before = plugin.generate([PROMPT, "Name a colour."])
    plugin.save_pretrained(tmp_path / "art")
    assert sorted(p.name for p in (tmp_path / "art").iterdir()) == [
        "README.md", "plugin_config.json", "reweighter", "tokenizer", "training.json"]
    loaded = PluginModel.from_pretrained(tmp_path / "art")  # the base loaded again from its spec
    assert loaded.generate([PROMPT, "Name a colour."]) == before
    assert loaded.decoding == CHAT and loaded.training["val_loss"] == 1.5
    for name, tensor in plugin.reweighter.state_dict().items():
        assert torch.equal(loaded.reweighter.state_dict()[name], tensor), name
    card = (tmp_path / "art" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: plugin-repro\n") and "smollm2-135m-instruct" in card
    assert read_config(tmp_path / "art")["base"]["name"] == "smollm2-135m-instruct"


def test_a_context_free_reweighter_round_trips(smollm2, tmp_path):
    reweighter = make_reweighter("mlp", smollm2.vocab_size, hidden_size=8, intermediate_size=16, seed=0)
    adapted = PluginModel(smollm2, reweighter, base_spec=BaseSpec("model", "smollm2-135m-instruct"), decoding=CHAT)
    adapted.save_pretrained(tmp_path / "mlp")
    loaded = PluginModel.from_pretrained(tmp_path / "mlp", base=smollm2)
    assert loaded.generate([PROMPT]) == adapted.generate([PROMPT])


def test_loading_over_another_tokenizer_is_refused(plugin, smollm2, tmp_path):
    plugin.save_pretrained(tmp_path / "art")
    other = smollm2.tokenizer.__class__.from_pretrained(tmp_path / "art" / "tokenizer")
    other.add_tokens(["<an-extra-token>"])
    other.save_pretrained(tmp_path / "art" / "tokenizer")
    with pytest.raises(TokenizerMismatch, match="trained on another tokenizer"):
        PluginModel.from_pretrained(tmp_path / "art", base=smollm2)


def test_a_failed_save_leaves_the_old_artifact_whole(plugin, tmp_path, monkeypatch):
    plugin.save_pretrained(tmp_path / "art")
    config = (tmp_path / "art" / "plugin_config.json").read_text()

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plugin.tokenizer, "save_pretrained", disk_full)  # midway: the reweighter is written
    with pytest.raises(OSError, match="No space left"):
        plugin.save_pretrained(tmp_path / "art")
    assert (tmp_path / "art" / "plugin_config.json").read_text() == config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no partial directory left


def test_a_directory_that_is_not_an_artifact_is_named(tmp_path):
    with pytest.raises(ArtifactError, match="not a Plugin artifact"):
        PluginModel.from_pretrained(tmp_path)


# ---------------------------------------------------------------- the command line


def test_the_command_line_trains_and_generates_from_a_jsonl(tmp_path):
    """``plugin-repro train`` then ``generate``, as installed (the console script's module)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "plugin_lib.serving.cli"]
    trained = subprocess.run(run + ["train", "--base", "smollm2-135m-instruct", "--data", str(PAIRS), "--out",
                                    str(tmp_path / "mine"), "--profile", "smoke", "--chat"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "hyper-validation loss" in trained.stdout
    record = json.loads((tmp_path / "mine" / "training.json").read_text())
    assert record["pairs"] == 12 and record["train_pairs"] + record["hyper_pairs"] == 12
    assert record["hparams"] == {"lr": 5e-3, "weight_decay": 0.01} and record["profile"] == "smoke"
    (tmp_path / "prompts.txt").write_text(f"{PROMPT}\nName a colour.\n")
    generated = subprocess.run(run + ["generate", "--plugin", str(tmp_path / "mine"), "--file",
                                      str(tmp_path / "prompts.txt"), "--max-new-tokens", "8"],
                               capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert generated.returncode == 0, generated.stderr[-2000:]
    rows = [json.loads(line) for line in generated.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == [PROMPT, "Name a colour."]
    assert all(isinstance(r["completion"], str) and r["completion"] for r in rows)


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("", "is empty"),
    ('{"prompt": "a"}\n', "'completion' is missing"),
    ('{"prompt": "a", "completion": 3}\n', "not a non-empty string"),
    ('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "c"}\n', "distinct prompts"),
    ("not json\n", "not a JSON object"),
])
def test_bad_training_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "pairs.jsonl"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(cli.app, ["train", "--base", "smollm2-135m-instruct", "--data", str(path),
                                          "--out", str(tmp_path / "out"), "--profile", "smoke"])
    assert result.exit_code == 2
    assert message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "out").exists()


def test_a_csv_without_the_columns_and_an_unknown_base_are_named(tmp_path):
    (tmp_path / "pairs.csv").write_text("question,answer\na,b\n")
    with pytest.raises(DataFileError, match="no column 'prompt', 'completion'"):
        read_pairs(tmp_path / "pairs.csv")
    result = CliRunner().invoke(cli.app, ["train", "--base", "no-such-model", "--data", str(PAIRS), "--out",
                                          str(tmp_path / "out"), "--profile", "smoke"])
    assert result.exit_code == 2 and "Unknown base model 'no-such-model'" in result.output


def test_generate_needs_exactly_one_prompt_source(tmp_path):
    result = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path)])
    assert result.exit_code == 2 and "exactly one of --prompt and --file" in result.output


# ---------------------------------------------------------------- the endpoint


class Served:
    """``create_app`` under a real uvicorn server in a thread, with an ``openai`` client."""

    def __init__(self, adapted: PluginModel, limits: Limits = Limits(), **options):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = options.get("api_key") or "unused"
        grace_s = options.pop("grace_s", 5.0)
        self.app = create_app(adapted, model_id="mine", limits=limits, **options)
        self.server = GracefulServer(self.app, host="127.0.0.1", port=self.port, grace_s=grace_s, log_level="info")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=300)

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def ask_at_once(client, prompts: list[str], max_tokens: int) -> list[str]:
    """Each prompt from a client thread of its own, all at once; the texts in the prompts' order."""
    answers = [None] * len(prompts)

    def ask(i):
        answers[i] = client.completions.create(model="mine", prompt=prompts[i], max_tokens=max_tokens).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return answers


def _wait_until(condition, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_completions_chat_and_streaming(plugin):
    with Served(plugin) as client:
        assert [m.id for m in client.models.list().data] == ["mine"]
        done = client.completions.create(model="mine", prompt=PROMPT, max_tokens=12)
        assert done.choices[0].text.strip() == plugin.generate([PROMPT], max_new_tokens=12)[0]
        assert done.usage.completion_tokens <= 12 and done.usage.prompt_tokens > 10
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="mine", prompt=PROMPT, max_tokens=12, stream=True))
        assert streamed == done.choices[0].text

        messages = [{"role": "user", "content": PROMPT}]
        chat = client.chat.completions.create(model="mine", messages=messages, max_tokens=12)
        assert chat.choices[0].message.content == done.choices[0].text  # the same template, one user turn
        chunks = list(client.chat.completions.create(model="mine", messages=messages, max_tokens=12, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == chat.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")

        two = client.completions.create(model="mine", prompt=[PROMPT, "Name a colour."], max_tokens=6)
        assert [c.index for c in two.choices] == [0, 1]  # decoded together, each as alone
        assert [c.text for c in two.choices] == [plugin.complete(plugin.format_prompt(p), max_new_tokens=6).text
                                                 for p in (PROMPT, "Name a colour.")]


def test_a_stop_string_cuts_the_text_streamed_or_not(plugin):
    with Served(plugin) as client:
        full = client.completions.create(model="mine", prompt=PROMPT, max_tokens=12).choices[0].text
        stop = full.split()[2]
        done = client.completions.create(model="mine", prompt=PROMPT, max_tokens=12, stop=[stop])
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="mine", prompt=PROMPT, max_tokens=12, stop=stop, stream=True))
    assert done.choices[0].text == streamed == full[: full.index(stop)]
    assert done.choices[0].finish_reason == "stop"


def test_the_stop_scanner_holds_back_a_partial_stop_string():
    scanner = StopScanner(["END"])
    assert scanner.feed("abc E") == "abc"  # " E" could begin "END"
    assert scanner.feed("N") == " "
    assert scanner.feed("Dx") == "" and scanner.stopped and scanner.flush() == ""
    assert StopScanner(["END"]).feed("abcEN") + "" == "abc"


def test_requests_are_checked_and_answered_without_building_the_app(plugin):
    """The routes are thin: the service checks a request and shapes the answer by itself."""
    service = CompletionService(plugin, "mine", Limits(max_tokens=32, max_prompt_tokens=200))
    try:
        settings = service.check(CompletionRequest(model="mine", prompt=PROMPT, max_tokens=8, stop="END"), [PROMPT])
        assert settings.max_new_tokens == 8 and settings.stops == ("END",)
        with pytest.raises(OpenAIError) as caught:
            service.check(CompletionRequest(prompt=PROMPT, max_tokens=64), [PROMPT])
        assert caught.value.status == 400 and caught.value.param == "max_tokens"
        with pytest.raises(OpenAIError, match="prompt is empty"):
            service.completion_prompts([])
        done = [Completion("a text", 3, 2, "length")]
        answer = service.response(done, chat=True)
        assert answer["choices"][0]["message"]["content"] == "a text" and answer["usage"]["total_tokens"] == 5
        assert service.models()["data"][0]["id"] == "mine"
    finally:
        service.close()


@pytest.mark.parametrize("bad, status, param", [
    ({"max_tokens": 10_000}, 400, "max_tokens"),
    ({"temperature": 3.0}, 400, "temperature"),
    ({"n": 2}, 400, "n"),
    ({"extra_body": {"logprobs": 5}}, 400, "logprobs"),
    ({"model": "someone-else"}, 404, "model"),
    ({"prompt": "word " * 300}, 400, "prompt"),
])
def test_bad_parameters_get_openai_errors(plugin, bad, status, param):
    with Served(plugin, Limits(max_prompt_tokens=200)) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(**{"model": "mine", "prompt": PROMPT, **bad})
    assert caught.value.status_code == status
    assert caught.value.body["param"] == param and caught.value.body["message"]


def test_a_full_queue_is_503_and_concurrent_clients_all_get_their_answer(plugin):
    prompts = [PROMPT, "Name a colour.", "Name a fruit.", "Name a city."]
    serial = plugin.generate(prompts, max_new_tokens=8)
    with Served(plugin, Limits(max_concurrency=1, max_queue=len(prompts))) as client:
        assert ask_at_once(client, prompts, 8) == serial

    with Served(plugin, Limits(max_concurrency=1, max_queue=0)) as client:
        stream = client.completions.create(model="mine", prompt=PROMPT, max_tokens=64, stream=True)
        next(iter(stream))  # the first request holds the only slot
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="mine", prompt=PROMPT, max_tokens=4)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "queue_full"
        list(stream)


# ---------------------------------------------------------------- over a real upstream

SECRET = "sk-upstream-secret-4b1d"


@pytest.fixture(scope="module")
def upstream():
    if api_server.llama_cpp_missing():
        pytest.skip(api_server.llama_cpp_missing())
    with LlamaCppServer(n_threads=1, api_key=SECRET) as server:
        yield server


def _endpoint_plugin(url: str, reweighter, *, max_retries: int = 4) -> PluginModel:
    tokenizer = models.api_tokenizer(models.model_spec("smollm2-135m-instruct-api"))
    client = CompletionsClient(url, api_key_env="PLUGIN_TEST_UPSTREAM_KEY", max_retries=max_retries, timeout_s=120,
                               max_concurrency=1)
    base = ApiBlackBox(client, tokenizer, 20)
    return PluginModel(base, reweighter, base_spec=BaseSpec("endpoint", url, top_k=20, api_key_env="PLUGIN_TEST_UPSTREAM_KEY"),
                       decoding=CHAT)


@needs_llama_cpp
def test_an_endpoint_plugin_is_served_and_never_logs_the_key(upstream, plugin, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PLUGIN_TEST_UPSTREAM_KEY", SECRET)
    adapted = _endpoint_plugin(upstream.base_url, plugin.reweighter)
    adapted.save_pretrained(tmp_path / "remote")
    loaded = PluginModel.from_pretrained(tmp_path / "remote")  # checks the server and its tokenizer
    expected = plugin.generate([PROMPT], max_new_tokens=8)[0]  # in process, the same weights
    caplog.set_level(logging.DEBUG)
    with Served(loaded) as client:
        done = client.completions.create(model="mine", prompt=PROMPT, max_tokens=8)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="mine", prompt=PROMPT, max_tokens=8, stream=True))
        chat = client.chat.completions.create(model="mine", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=8)
    assert done.choices[0].text == streamed == chat.choices[0].message.content
    # the GGUF upstream against float32 in process: near-ties may differ, the first words agree
    assert done.choices[0].text.split()[:2] == expected.split()[:2]
    assert SECRET not in caplog.text and SECRET not in json.dumps(loaded.training)
    assert SECRET not in "".join(p.read_text(errors="ignore") for p in (tmp_path / "remote").rglob("*") if p.is_file())


@needs_llama_cpp
def test_an_upstream_stopped_mid_request_is_502_or_an_error_event(plugin, monkeypatch):
    monkeypatch.setenv("PLUGIN_TEST_UPSTREAM_KEY", SECRET)
    with LlamaCppServer(n_threads=1, api_key=SECRET) as doomed:
        adapted = _endpoint_plugin(doomed.base_url, plugin.reweighter, max_retries=1)
        with Served(adapted) as client:
            stream = iter(client.completions.create(model="mine", prompt=PROMPT, max_tokens=200, stream=True))
            next(stream)
            doomed.process.kill()
            with pytest.raises(openai.APIError, match="upstream base failed"):
                list(stream)
            with pytest.raises(openai.APIStatusError) as caught:
                client.completions.create(model="mine", prompt=PROMPT, max_tokens=4)
    assert caught.value.status_code == 502 and caught.value.body["code"] == "upstream_failed"


def test_train_takes_budget_and_size_from_flags_estimates_first_and_refits(tmp_path, monkeypatch):
    """Issue 44: epochs, learning rates and the reweighting model's size from flags; the time
    estimate before the grid starts; by default a refit on every pair (issue 61), which the model
    card states; the profile chosen for the machine.
    Its own cache folder: the base's outputs are computed here, as on a new machine, and what is
    said about them goes to stderr, so stdout holds only the result."""
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "cache"))
    done = CliRunner().invoke(cli.app, ["train", "--base", "smollm2-135m-instruct", "--data", str(PAIRS), "--out",
                                        str(tmp_path / "mine"), "--epochs", "2", "--lr", "1e-3", "--lr", "5e-3",
                                        "--reweighter-width", "64"])
    assert done.exit_code == 0, done.output
    assert "estimated " in done.stderr and "timed here" in done.stderr and "chosen for this machine" in done.stderr
    assert done.stdout.startswith("wrote ") and "base-output cache of" in done.stderr
    record = json.loads((tmp_path / "mine" / "training.json").read_text())
    assert record["max_epochs"] == 2 and record["grid"]["lr"][:2] == [1e-3, 5e-3]
    assert record["arch"]["hidden_size"] == 64 and record["arch"]["intermediate_size"] == 256
    assert record["refit"]["pairs"] == 12 and record["refit"]["epochs"] == record["best_epoch"]
    card = (tmp_path / "mine" / "README.md").read_text()
    assert f"The saved model trained on all 12 pairs for {record['best_epoch']} epochs" in card
    assert (f"chosen on {record['train_pairs']} training and {record['hyper_pairs']} hyper-validation pairs" in card)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "mine"]  # no resume state left behind
    bad = CliRunner().invoke(cli.app, ["train", "--base", "smollm2-135m-instruct", "--data", str(PAIRS), "--out",
                                       str(tmp_path / "other"), "--reweighter-width", "50", "--lr", "-1"])
    assert bad.exit_code == 2 and "--lr must be positive" in bad.output


def test_an_interrupted_training_resumes_and_base_outputs_are_reused(smollm2, tmp_path, monkeypatch):
    from plugin_lib.core.train import TokenObjective
    from plugin_lib.harness.profile import load_profile
    from plugin_lib.serving.recipe import TrainingRecipe
    from plugin_lib.serving.training import train_plugin

    pairs, spec = read_pairs(PAIRS), BaseSpec("model", "smollm2-135m-instruct")
    arch = {"arch": "llama", "n_layer": 1, "hidden_size": 32, "num_attention_heads": 1, "intermediate_size": 64}
    profile = TrainingRecipe.from_profile(load_profile("smoke")).replace(arch=arch)
    kept = dict(cache_dir=tmp_path / "outputs", resume_dir=tmp_path / "resume", progress=False)
    first = train_plugin(smollm2, spec, pairs, profile, **kept)
    assert list((tmp_path / "resume").glob("config-*.pt")) and list((tmp_path / "outputs").glob("base-*.npy"))
    # Again, as after an interrupt: nothing is trained and the base is not run again.
    monkeypatch.setattr(TokenObjective, "nll", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(type(smollm2), "logits", lambda *a, **k: pytest.fail("the base ran again"))
    again = train_plugin(smollm2, spec, pairs, profile, **kept)
    assert again.training["hparams"] == first.training["hparams"]
    assert again.training["val_loss"] == first.training["val_loss"]


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "reweighter" / "model.safetensors").write_bytes(
        (d / "reweighter" / "model.safetensors").read_bytes()[:1000]), "mine/reweighter:"),
    (lambda d: (d / "reweighter" / "config.json").write_text('{"vocab_size": '), "mine/reweighter:"),
    (lambda d: (d / "plugin_config.json").write_text("{not json"), "plugin_config.json"),
])
def test_a_damaged_artifact_is_one_line_naming_the_file(plugin, tmp_path, damage, named):
    plugin.save_pretrained(tmp_path / "mine")
    damage(tmp_path / "mine")
    done = CliRunner().invoke(cli.app, ["generate", "--plugin", str(tmp_path / "mine"), "--prompt", "x"])
    assert done.exit_code == 2 and "Traceback" not in done.output
    line = done.output.strip().splitlines()[-1]
    assert line.startswith("plugin-repro: error: ") and named in line and "damaged" in line


def test_a_data_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes('{"prompt": "caf\u00e9", "completion": "x"}\n'.encode("latin-1"))
    with pytest.raises(DataFileError, match=r"pairs.jsonl: not UTF-8 text \(byte"):
        read_pairs(path)


def test_a_model_card_without_a_refit_says_it_saw_the_training_part_only():
    from plugin_lib.serving.artifact import _what_it_saw

    said = _what_it_saw({"pairs": 600, "train_pairs": 360, "hyper_pairs": 240})
    assert said.startswith("The saved model trained on the 360 training pairs only (no refit)")


def test_a_training_recipe_is_the_profile_s_settings_and_can_be_written_by_hand():
    """The user's train reads a ``TrainingRecipe``: a profile's (its grid, budget, seed, limits and
    decoding defaults, as the runner reads them), or one written without any profile."""
    from plugin_lib.core.grid_search import configurations
    from plugin_lib.harness.running import run_keys
    from plugin_lib.harness.profile import load_profile
    from plugin_lib.serving.recipe import TrainingRecipe

    for name in ("smoke", "local", "paper"):
        profile = load_profile(name)
        recipe = TrainingRecipe.from_profile(profile)
        assert configurations(recipe.grid()) == run_keys.hparam_grid(profile, "Plugin")
        assert (recipe.max_epochs, recipe.patience, recipe.seed, recipe.max_prompt_tokens, recipe.name) == (
            profile.training.max_epochs, profile.training.patience, profile.seeds[0], profile.tokens.max_prompt, name)
    own = dict(lr=(1e-3,), weight_decay=(0.0, 0.01), extend_edges=0, max_epochs=2, patience=1, batch_size=4,
               warmup_ratio=0.1, seed=3, max_prompt_tokens=64, max_target_tokens=32, max_new_tokens=16,
               repetition_penalty=1.0)
    recipe = TrainingRecipe(**own)
    assert recipe.name == "custom" and configurations(recipe.grid()) == [
        {"lr": 1e-3, "weight_decay": 0.0}, {"lr": 1e-3, "weight_decay": 0.01}]
    assert (recipe.train_config(seed=3).seed, recipe.train_config(seed=3).max_epochs) == (3, 2)
    with pytest.raises(ValueError, match="learning rates must be positive"):
        TrainingRecipe(**{**own, "lr": (0.0,)})
    with pytest.raises(TypeError):
        TrainingRecipe(lr=(1e-3,))  # every setting is given: none is invented here
