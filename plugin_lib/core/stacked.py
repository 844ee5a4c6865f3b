"""Configurations of a grid stepped as one stacked model (``torch.func.vmap``).

On a GPU a reweighting model's training step is bound by the host, not the device: a step of
the LLaMA-8B twin's reweighter dispatches about 210 computing operations (benchmarks/bench_fused.py
counts them) and took 8-12 ms on an H200, where its arithmetic and memory traffic take about 1 ms. ``fit_grid``'s shared batches
save the reading, not those operations. A ``ParameterStack`` holds each parameter of several
same-shaped models as one tensor with a leading configuration axis; the forward and backward
run once for all of them, ``vmap`` over that axis, while each model keeps its own optimiser,
schedule and early stopping (``core.train``).

Exact: a configuration's loss and gradients equal its own step's up to the rounding of batched
kernels (bitwise for the LLaMA-style model on a CPU; within 2e-8 for GPT-2's), and on a CPU
dropout draws the masks its own step draws. That holds because the configurations of a grid
share the seed and the batches, so their random generators are equal at every step: the stack
draws once from that state (``randomness="same"``), as each model alone would, and
``core.train`` stacks only runs whose generator states are equal. On a GPU, models with dropout
(GPT-2's reweighters) step alone (``stack_signature``); the LLaMA-style and context-free ones,
which draw nothing, stack.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

from .reweighter import ExpertDifference


def draws_dropout(model: nn.Module) -> bool:
    """Whether ``model`` drops activations when training: GPT-2's dropout modules (0.1 each, its
    attention's among them), or an attention dropout set on a LLaMA-style layer."""
    return any((isinstance(m, nn.Dropout) and m.p > 0) or getattr(m, "attention_dropout", 0.0) > 0
               for m in model.modules())


def stack_signature(model: nn.Module) -> tuple | None:
    """Models with equal signatures compute the same function of their parameters; None for a
    model that cannot be stacked: proxy-tuning's pair, one with frozen parameters, or, off the
    CPU, one with dropout. A CPU draws dropout's mask with ``bernoulli_``, which ``vmap`` draws
    once for all (``randomness="same"``); a GPU uses fused dropout kernels, which ``vmap``
    refuses to draw once for a stack ("same randomness with a batched tensor input"), and whose
    masks no stacked draw could match anyway."""
    if isinstance(model, ExpertDifference) or not all(p.requires_grad for p in model.parameters()):
        return None
    if next(model.parameters()).device.type != "cpu" and draws_dropout(model):
        return None
    params = tuple((name, tuple(p.shape), p.dtype, p.device) for name, p in model.named_parameters())
    return type(model), repr(model), params, model.training


class _Loss(nn.Module):
    """``objective.batch_nll(model, batch)``'s summed loss as a module's forward, for ``functional_call``."""

    def __init__(self, model: nn.Module, objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: dict) -> torch.Tensor:
        return self.objective.batch_nll(self.model, batch)[0]


class ParameterStack:
    """The parameters of ``models`` (equal ``stack_signature``s) stacked along a new first axis;
    each model's parameters become views of the stack until ``release``, so their optimisers,
    state dicts and checkpoints see the stacked values. Buffers are the first model's (equal
    signatures: the same constants)."""

    def __init__(self, models: Sequence[nn.Module]):
        self.models = list(models)
        named = [dict(m.named_parameters()) for m in self.models]
        self.stacked: dict[str, torch.Tensor] = {}
        for name in named[0]:
            whole = torch.stack([params[name].detach() for params in named])
            for i, params in enumerate(named):
                params[name].data = whole[i]
            self.stacked[name] = whole.requires_grad_(True)
        self._named = named

    def losses_and_gradients(self, objective, batch: dict, autocast=contextlib.nullcontext()
                             ) -> tuple[list[float], int]:
        """Each model's summed token NLL on ``batch`` (``TokenObjective.batch_nll``) in one vmapped
        forward (under ``autocast``), and the batch's target tokens; each model's mean token loss
        backpropagated, its gradients in its parameters' ``grad`` for its own optimiser."""
        wrapper = _Loss(self.models[0], objective)
        prefixed = {f"model.{name}": value for name, value in self.stacked.items()}
        with autocast:
            losses = vmap(lambda params: functional_call(wrapper, params, (batch,)), randomness="same")(prefixed)
        tokens = batch["targets"].numel()
        for whole in self.stacked.values():
            whole.grad = None
        (losses / tokens).sum().backward()
        for i, params in enumerate(self._named):
            for name, param in params.items():
                param.grad = self.stacked[name].grad[i]
        return losses.tolist(), tokens

    def release(self) -> None:
        """Each model's parameters get their own storage again (its state dict saves its own weights only)."""
        for params in self._named:
            for param in params.values():
                param.data = param.data.clone()
                param.grad = None
        self.stacked.clear()
