"""A grid stepped as one stacked model (``core.stacked``, ``fit_grid(stack=True)``) equals each
configuration trained alone for every reweighting architecture the searches stack: GPT-2's
(dropout in the embeddings, the attention and the residuals, drawn as each model alone draws
it) and the context-free one; the LLaMA one is in tests/test_fused_training.py. Models that
cannot share a stack step alone. Twins have random weights: twin: says nothing about the
paper's numbers."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from plugin_lib.core import train as train_module
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.reweighter import ExpertDifference, make_reweighter, reweighter_logits
from plugin_lib.core.stacked import ParameterStack, draws_dropout, stack_signature
from plugin_lib.core.train import GridRun, TokenObjective, TrainConfig, fit, fit_grid
from plugin_lib.harness import models

from devices import assert_forward_close

SOURCES = ["name[The Eagle], eatType[coffee shop]", "name[Aromi], area[city centre]", "name[Zizzi], food[Italian]",
           "name[Cotto], food[Indian]", "name[Blue Spice], area[riverside]", "name[The Mill], food[Indian]",
           "name[Loch Fyne], food[Japanese]", "name[The Punter], priceRange[cheap]"]
TARGETS = ["The Eagle is a coffee shop.", "Aromi is in the centre.", "Zizzi is Italian.", "Cotto serves Indian food.",
           "Blue Spice is by the river.", "The Mill is Indian.", "Loch Fyne is Japanese.", "The Punter is cheap."]
GRID = [(3e-3, 0.01), (3e-2, 0.01), (3e-1, 0.0)]  # the largest lr overshoots and stops first


@pytest.fixture(scope="module")
def twin():
    return models.load_base_model("gpt2-medium-twin-small", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def objectives(twin, tmp_path_factory):
    pairs = encode_pairs(twin.tokenizer, SOURCES, TARGETS)
    parts, folder = (pairs[:6], pairs[6:]), tmp_path_factory.mktemp("caches")
    return [TokenObjective(part, twin.tokenizer.pad_token_id,
                           cache=BaseOutputCache.build(twin, part, layout="compact", directory=folder / str(i),
                                                       progress=False))
            for i, part in enumerate(parts)]


def gpt2_reweighter(vocab_size: int) -> torch.nn.Module:
    """The GPT-2 family's reweighting model (``make_reweighter("gpt2")``: GPT2Config's dropouts of
    0.1), narrowed for a CPU test."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_layer=1, n_embd=32, n_head=2))


def mlp_reweighter(vocab_size: int) -> torch.nn.Module:
    return make_reweighter("mlp", vocab_size, seed=0, hidden_size=16, intermediate_size=32)


def configs() -> list[TrainConfig]:
    return [TrainConfig(lr=lr, weight_decay=wd, max_epochs=6, patience=2, batch_size=4, seed=3) for lr, wd in GRID]


@pytest.mark.parametrize("build", [gpt2_reweighter, mlp_reweighter], ids=["gpt2", "context-free"])
def test_a_stacked_grid_equals_each_configuration_alone(twin, objectives, build):
    train, val = objectives
    alone_models = [build(twin.vocab_size) for _ in GRID]
    alone = [fit(model, train, val, cfg, progress=False) for model, cfg in zip(alone_models, configs())]
    assert len({r.epochs_run for r in alone}) > 1, "the grid should stop at different epochs"
    stacked_models = [build(twin.vocab_size) for _ in GRID]
    stacked = fit_grid([GridRun(m, train, val, cfg) for m, cfg in zip(stacked_models, configs())],
                       progress=False, stack=True)
    assert all(r.stacked for r in stacked) and not any(r.stacked for r in alone)
    for a, b, model_a, model_b in zip(stacked, alone, stacked_models, alone_models):
        assert (a.best_epoch, a.epochs_run, a.optimizer_steps) == (b.best_epoch, b.epochs_run, b.optimizer_steps)
        # The stacked path's batched kernels sum in another order than one model's. A pairwise sum
        # of n float32 terms rounds within eps * log2(n) (relative), the longest here the
        # vocabulary's log-softmax, and Adam carries each step's difference into the next: after k
        # optimizer steps the losses agree within k such bounds, whatever CPU's kernels ran.
        steps_per_epoch = math.ceil(len(train) / configs()[0].batch_size)
        per_step = torch.finfo(torch.float32).eps * math.log2(twin.vocab_size)
        for epoch, (x, y) in enumerate(zip(a.history, b.history), start=1):
            rel = per_step * steps_per_epoch * epoch
            assert x["train_loss"] == pytest.approx(y["train_loss"], rel=rel)
            assert x["val_loss"] == pytest.approx(y["val_loss"], rel=rel)
        batch = val.batch(range(len(val)), torch.device("cpu"))
        assert_forward_close(reweighter_logits(model_a, batch["input_ids"], batch["attention_mask"]),
                             reweighter_logits(model_b, batch["input_ids"], batch["attention_mask"]))
        for key, value in model_b.state_dict().items():
            other = model_a.state_dict()[key]
            if key.endswith("attn.c_attn.bias"):
                # The keys' bias shifts every score of a row alike, which softmax ignores: its true
                # gradient is 0, so Adam scales rounding noise to lr-sized steps, the same in either
                # path. Only the queries' and values' thirds are determined.
                width = value.shape[0] // 3
                value, other = (torch.cat([t[:width], t[2 * width:]]) for t in (value, other))
            assert_forward_close(other, value)
        # released: each model's weights are its own again, not views of the stack
        assert all(p.untyped_storage().nbytes() == p.nbytes for p in model_a.parameters())


def test_a_stack_shares_its_parameters_with_the_models_until_released(twin):
    first, second = gpt2_reweighter(twin.vocab_size), gpt2_reweighter(twin.vocab_size)
    with torch.no_grad():
        second.lm_head.weight.add_(1.0)  # tied to the embeddings: one parameter, stacked once
    stack = ParameterStack([first, second])
    assert list(stack.stacked) == [name for name, _ in first.named_parameters()]
    assert first.transformer.wte.weight.untyped_storage().data_ptr() == \
        stack.stacked["transformer.wte.weight"].untyped_storage().data_ptr()
    torch.testing.assert_close(stack.stacked["lm_head.weight"][1] if "lm_head.weight" in stack.stacked
                               else stack.stacked["transformer.wte.weight"][1], second.lm_head.weight.detach())
    stack.release()
    assert first.transformer.wte.weight.untyped_storage().nbytes() == first.transformer.wte.weight.nbytes


def test_dropout_is_found_where_each_family_draws_it():
    """Off the CPU a model with dropout steps alone (``stack_signature``): GPT-2's reweighters
    draw it (0.1 in their dropout modules), the LLaMA-style one only if its attention sets it."""
    assert draws_dropout(gpt2_reweighter(64))
    llama = make_reweighter("llama", 64, seed=0, hidden_size=16, intermediate_size=32)
    assert not draws_dropout(llama) and not draws_dropout(mlp_reweighter(64))
    llama.model.layers[0].self_attn.attention_dropout = 0.2
    assert draws_dropout(llama)
    assert stack_signature(gpt2_reweighter(64)) is not None  # on the CPU its masks are drawn as alone


def test_models_that_cannot_share_a_stack_step_alone(twin, objectives):
    train, val = objectives
    frozen = mlp_reweighter(twin.vocab_size)
    frozen.embed.weight.requires_grad_(False)
    pair = ExpertDifference(mlp_reweighter(twin.vocab_size), mlp_reweighter(twin.vocab_size))
    assert stack_signature(frozen) is None and stack_signature(pair) is None
    assert stack_signature(mlp_reweighter(twin.vocab_size)) == stack_signature(mlp_reweighter(twin.vocab_size))
    assert stack_signature(mlp_reweighter(twin.vocab_size)) != stack_signature(gpt2_reweighter(twin.vocab_size))
    runs = [GridRun(m, train, val, cfg) for m, cfg in zip(
        [mlp_reweighter(twin.vocab_size), mlp_reweighter(twin.vocab_size), gpt2_reweighter(twin.vocab_size), frozen],
        configs() + [configs()[0]])]
    states = [train_module._RunState(run) for run in runs]
    units = train_module._step_units(states, stack=True)
    assert sorted(len(members) for members, _ in units) == [1, 1, 2]  # the two context-free models stack
    for members, parameters in units:
        assert (parameters is not None) == (len(members) > 1)
        if parameters is not None:
            parameters.release()
    torch.manual_seed(99)
    states[1].cpu_rng = torch.get_rng_state()  # e.g. resumed from another point: its dropout differs
    units = train_module._step_units(states[:2], stack=True)
    assert [len(members) for members, _ in units] == [1, 1]
    assert [len(m) for m, _ in train_module._step_units(states[:2], stack=False)] == [1, 1]


class Killed(Exception):
    """Stands for a process killed mid-grid."""


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "removed-at-the-end"])
@pytest.mark.parametrize("every_s", [0, 1e9], ids=["saved-each-epoch", "saved-when-one-finishes"])
def test_a_killed_stacked_grid_resumes_bit_for_bit(twin, objectives, tmp_path, monkeypatch, every_s, keep):
    """Issue 76: resuming a stacked grid gives the uninterrupted stacked grid's weights exactly,
    GPT-2's dropout and undetermined key bias included, whether the others resume from their
    last checkpoint or (none saved yet) start again in a smaller stack. A configuration that
    finished keeps its state until the grid ends, so a resume never trains it again alone (a run
    that steps alone rounds as ``fit`` does, not as the stack: the probe's 8.6e-5)."""
    train, val = objectives
    whole_models = [gpt2_reweighter(twin.vocab_size) for _ in GRID]
    whole = fit_grid([GridRun(m, train, val, cfg) for m, cfg in zip(whole_models, configs())], progress=False,
                     stack=True)
    first_stop = min(r.epochs_run for r in whole)
    assert first_stop < max(r.epochs_run for r in whole)
    paths = [tmp_path / f"config-{i}.pt" for i in range(len(GRID))]

    def runs(models_):
        return [GridRun(m, train, val, cfg, checkpoint=path, keep_checkpoint=keep)  # kept: as train and the runner
                for m, cfg, path in zip(models_, configs(), paths)]

    real, calls = train_module.mean_nlls, []

    def dying(pairs, batch_size=16):  # killed at the validation after the first configuration stopped
        calls.append(1)
        if len(calls) == first_stop + 1:
            raise Killed
        return real(pairs, batch_size)

    monkeypatch.setattr(train_module, "mean_nlls", dying)
    with pytest.raises(Killed):
        fit_grid(runs([gpt2_reweighter(twin.vocab_size) for _ in GRID]), progress=False, checkpoint_every_s=every_s,
                 stack=True)
    monkeypatch.setattr(train_module, "mean_nlls", real)
    torch.manual_seed(12345)  # a new process: the global generator is elsewhere
    resumed_models = [gpt2_reweighter(twin.vocab_size) for _ in GRID]
    resumed = fit_grid(runs(resumed_models), progress=False, checkpoint_every_s=every_s, stack=True)
    for a, b, model_a, model_b in zip(resumed, whole, resumed_models, whole_models):
        assert (a.best_epoch, a.epochs_run, a.optimizer_steps, a.history) == (
            b.best_epoch, b.epochs_run, b.optimizer_steps, b.history)
        for key, value in model_b.state_dict().items():
            assert torch.equal(model_a.state_dict()[key], value), key
    assert all(path.exists() for path in paths) == keep
