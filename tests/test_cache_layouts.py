"""The compact base-output cache (final hidden states + the base's output layer) is exact: it
gives the log-probabilities, and so the Plugin's loss, of the full-vocabulary cache.

GPT-2 and LLaMA shapes (small twins), tied (GPT-2, SmolLM2) and untied (LLaMA-3.1) output
layers, float32 and half precision; top-k views read the same stored states; the layout rule.
Twins have random weights: twin: says nothing about the paper's numbers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from plugin_lib.core.blackbox import TopKBlackBox
from plugin_lib.core.cache import GIB, BaseOutputCache, choose_layout, compact_supported
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import TokenObjective
from plugin_lib.harness import models

PROMPTS = ["name[The Eagle], eatType[coffee shop], food[French]", "name[Aromi], area[city centre]",
           "name[Zizzi], eatType[pub], food[Italian], near[The Sorrento]", "name[Cotto], food[Indian]"]
TARGETS = ["The Eagle is a French coffee shop.", "Aromi is in the city centre.", "Zizzi is an Italian pub.",
           "Cotto serves Indian food near the river."]
# The tolerance the package already holds a cache to: float32 to rounding, half precision to
# 1e-3 nats per token (tests/test_twins.py: a float16 cache against a float32 recomputation).
LOSS_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-3, torch.float16: 1e-3}


def _plugin_loss(base, cache, pairs) -> float:
    reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(base.name))
    return TokenObjective(pairs, base.tokenizer.pad_token_id, cache=cache).mean_nll(reweighter, batch_size=3)


@pytest.mark.parametrize("name,tied", [("gpt2-medium-twin-small", True), ("llama-3.1-8b-twin-small", False),
                                       ("smollm2-135m-instruct", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_compact_cache_gives_the_full_caches_loss(name, tied, dtype, tmp_path):
    base = models.load_base_model(name, dtype=dtype, device="cpu")
    model = base._model
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    full = BaseOutputCache.build(base, pairs, layout="full", progress=False)
    compact = BaseOutputCache.build(base, pairs, layout="compact", directory=tmp_path, progress=False)
    assert compact.layout == "compact" and compact.vocab_size == full.vocab_size == base.vocab_size
    (stored,) = tmp_path.glob("base-*.hidden-*.npy")
    width = model.get_output_embeddings().weight.shape[1]
    tokens = sum(p.target_length for p in pairs)
    assert stored.stat().st_size < tokens * width * compact.rows.itemsize + 256  # d values a token, not V
    assert compact.dtype == dtype  # the model's own dtype (bfloat16 stored as its bits)
    difference = abs(_plugin_loss(base, compact, pairs) - _plugin_loss(base, full, pairs))
    assert difference < LOSS_TOLERANCE[dtype]
    if dtype == torch.float32:
        torch.testing.assert_close(compact.get([2, 0]), full.get([2, 0]), rtol=1e-5, atol=1e-5)


def test_top_k_views_read_the_same_stored_states(tmp_path):
    base = models.load_base_model("llama-3.1-8b-twin-small", dtype=torch.float32, device="cpu")
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    views = [TopKBlackBox(base, 20), TopKBlackBox(base, 5, "renormalize"), TopKBlackBox(base, None)]
    caches = [BaseOutputCache.build(box, pairs, layout="compact", directory=tmp_path, progress=False)
              for box in [base, *views]]
    assert len(list(tmp_path.glob("base-*.npy"))) == 1  # one file of states for the base and its views
    for box, cache in zip(views, caches[1:]):
        full = BaseOutputCache.build(box, pairs, layout="full", progress=False)
        expected, got = full.get(range(len(pairs))), cache.get(range(len(pairs)))
        assert torch.equal(torch.isneginf(expected), torch.isneginf(got))  # renormalize rules the same out
        finite = torch.isfinite(expected)
        torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=1e-5)


def test_a_stored_cache_of_either_layout_is_reused_without_the_base_running(tmp_path, monkeypatch):
    base = models.load_base_model("gpt2-medium-twin-small", dtype=torch.float32, device="cpu")
    pairs = encode_pairs(base.tokenizer, PROMPTS, TARGETS)
    built = BaseOutputCache.build(base, pairs, layout="compact", directory=tmp_path, progress=False)
    assert BaseOutputCache.is_stored(tmp_path, base, pairs)

    def no_base(*args, **kwargs):
        raise AssertionError("the base ran although its states were on disk")

    monkeypatch.setattr(base, "hidden_at", no_base)
    monkeypatch.setattr(base, "logits_at", no_base)
    reused = BaseOutputCache.build(base, pairs, directory=tmp_path, progress=False)  # auto: the stored one
    assert reused.layout == "compact" and isinstance(reused.rows, np.memmap)
    torch.testing.assert_close(reused.get([1, 3]), built.get([1, 3]), rtol=0, atol=0)
    assert reused.get_rows([0, 5]).shape == (2, base.vocab_size)


def test_a_model_that_changes_its_output_layers_result_is_refused(tmp_path):
    base = models.load_base_model("gpt2-medium-twin-small", dtype=torch.float32, device="cpu")
    pairs = encode_pairs(base.tokenizer, PROMPTS[:2], TARGETS[:2])

    def soft_cap(_module, _inputs, output):  # as Gemma-2's final logit soft-capping does
        output.logits = 30.0 * torch.tanh(output.logits / 30.0)
        return output

    handle = base._model.register_forward_hook(soft_cap)
    try:
        with pytest.raises(ValueError, match="layout 'full'"):
            BaseOutputCache.build(base, pairs, layout="compact", directory=tmp_path, progress=False)
        assert not list(tmp_path.iterdir())  # nothing partial left
        full = BaseOutputCache.build(base, pairs, layout="full", progress=False)
        assert full.layout == "full"
    finally:
        handle.remove()


def test_the_layout_rule():
    cpu = {"device_type": "cpu", "compact": True}
    assert choose_layout(3 * GIB, **cpu, host_available=20 * GIB, disk_free=50 * GIB)[0] == "full"
    assert choose_layout(12 * GIB, **cpu, host_available=20 * GIB, disk_free=50 * GIB)[0] == "compact"
    assert choose_layout(3 * GIB, **cpu, host_available=20 * GIB, disk_free=2 * GIB)[0] == "compact"
    assert choose_layout(1 * GIB, device_type="cuda", compact=True)[0] == "compact"
    assert choose_layout(300 * GIB, device_type="cuda", compact=False)[0] == "full"  # an API's log-probs


def test_only_a_model_in_this_process_has_an_output_layer(tiny_base):
    from plugin_lib.core.api import ApiBlackBox

    assert compact_supported(tiny_base) and compact_supported(TopKBlackBox(tiny_base, 20))
    assert ApiBlackBox.output_head(object.__new__(ApiBlackBox)) is None


def test_a_killed_builds_partial_file_is_gone_when_the_next_build_starts(tmp_path):
    """A build killed by kill -9 leaves its .partial (named after its host~pid); the next build
    in that folder removes it at once, since its process has ended, and leaves a live one's."""
    import subprocess
    import sys

    from plugin_lib.core.cache_files import owner_tag

    base = models.load_base_model("gpt2-medium-twin-small", dtype=torch.float32, device="cpu")
    pairs = encode_pairs(base.tokenizer, PROMPTS[:2], TARGETS[:2])
    target = BaseOutputCache.stored_path(tmp_path, base, pairs, "full")
    target.parent.mkdir(parents=True, exist_ok=True)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = owner_tag().rpartition("~")[0]
    killed = target.parent / f".{target.name}.{host}~{ended.stdout.strip()}.abc123.partial"
    alive = target.parent / f".{target.name}.{owner_tag()}.def456.partial"
    for path in (killed, alive):
        path.write_bytes(b"\0" * 1024)
    built = BaseOutputCache.build(base, pairs, layout="full", directory=tmp_path, progress=False)
    assert built.rows.shape[0] > 0 and not killed.exists() and alive.exists()
    assert sorted(p.name for p in target.parent.glob(".*.partial")) == [alive.name]
