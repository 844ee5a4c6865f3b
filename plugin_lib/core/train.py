"""Training a reweighting model against a frozen base.

The pieces, smallest first:
- ``encode_pairs`` / ``collate`` (``core.pairs``): (prompt, target) pairs as token ids, left padded, with labels
  that are -100 on prompt and padding (target truncated to 127 tokens, then EOS).
- ``BaseOutputCache`` (``core.cache``): the frozen base's log-probabilities at the target
  positions of every pair, computed once and reused by every epoch, seed, hyperparameter
  setting and method (Plugin, WeightedComb and TempNet all need the same base outputs); stored
  in full, or as the base's final hidden states that its output layer turns back into them.
- ``TokenObjective``: summed token NLL of a batch for one method (how base and small-model
  logits combine).
- ``fit``: AdamW, linear warmup then linear decay counted in optimiser steps, early stopping on
  hyper-validation loss with patience, best weights restored; seeded and deterministic.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from .cache import BaseOutputCache, gpu_headroom, host_available_bytes
from .checkpoint import load_checkpoint, save_atomically
from .loss import shift_labels, target_positions
from .pairs import EncodedPair, collate
from .reweighter import check_token_ids, check_vocabulary, reweighter_logits
from .stacked import ParameterStack, stack_signature

LogProbs = Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor]


def plugin_log_probs(base_log_probs: torch.Tensor, small_logits: torch.Tensor) -> torch.Tensor:
    """``combine_log_probs`` for a base that is already normalised (the cache's rows)."""
    return F.log_softmax(base_log_probs.float() + F.log_softmax(small_logits.float(), dim=-1), dim=-1)


def reachable_plugin_log_probs(base_log_probs: torch.Tensor, small_logits: torch.Tensor) -> torch.Tensor:
    """The Plugin's training log-probabilities on a view that rules tokens out (-inf).

    A target the base rules out cannot be produced by any reweighting, so it is left out of the
    loss: its log-probability reads 0 (no loss, no gradient) instead of -inf. Pass it as
    ``TokenObjective(log_probs=...)``. The objective still divides by every target token, so a
    left-out token counts as a zero in the mean loss: a batch's gradient shrinks by its share of
    reachable targets, which Adam's normalisation largely absorbs. On a view without -inf
    (residual, full vocabulary) it equals ``plugin_log_probs``.
    """
    return plugin_log_probs(base_log_probs, small_logits).masked_fill(torch.isneginf(base_log_probs), 0.0)


def small_model_log_probs(_base_log_probs: torch.Tensor | None, small_logits: torch.Tensor) -> torch.Tensor:
    """NewModel: the small model alone."""
    return F.log_softmax(small_logits.float(), dim=-1)


@dataclass
class TokenObjective:
    """Summed token NLL of batches of ``pairs`` for one way of combining base and small model.

    ``log_probs(base_log_probs, small_logits)`` gets the cached base log-probabilities at the
    target positions (None when ``cache`` is None, e.g. for NewModel) and the small model's
    logits there, and returns log-probabilities.
    """

    pairs: Sequence[EncodedPair]
    pad_token_id: int
    log_probs: LogProbs = plugin_log_probs
    cache: BaseOutputCache | None = None

    def __post_init__(self):
        if self.cache is not None and len(self.cache) != len(self.pairs):
            raise ValueError(f"cache holds {len(self.cache)} pairs, objective has {len(self.pairs)}")

    def __len__(self) -> int:
        return len(self.pairs)

    def check_model(self, model: torch.nn.Module) -> None:
        """ValueError, before any training, when ``model``'s vocabulary is not the cached
        base's, or (without a base) misses some token id of the pairs."""
        if self.cache is not None:
            check_vocabulary(self.cache.vocab_size, model)
        else:
            check_token_ids(max((max(p.input_ids) for p in self.pairs), default=0), model)

    def share_key(self) -> tuple:
        """Objectives with equal keys read the same batches (``batch``): a grid trained together
        (``fit_grid``) reads each batch, and applies the base's output layer, once for all."""
        return (type(self).batch, id(self.pairs), id(self.cache), self.pad_token_id)

    def batch(self, indices: Sequence[int], device: torch.device) -> dict:
        """What ``batch_nll`` needs of the pairs at ``indices``, whatever the model: the
        collated ids, the target positions and tokens, and the base's log-probabilities there."""
        batch = {k: v.to(device) for k, v in collate([self.pairs[i] for i in indices], self.pad_token_id).items()}
        positions = target_positions(batch["labels"])
        return {**batch, "positions": positions, "targets": shift_labels(batch["labels"])[positions],
                "base": self.cache.get(indices).to(device) if self.cache is not None else None}

    def batch_nll(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
        """Summed token NLL of ``model`` on a ``batch``, and its number of target tokens."""
        small = reweighter_logits(model, batch["input_ids"], batch["attention_mask"], batch["positions"])
        loss = F.nll_loss(self.log_probs(batch["base"], small), batch["targets"], reduction="sum")
        return loss, batch["targets"].numel()

    def nll(self, model: torch.nn.Module, indices: Sequence[int]) -> tuple[torch.Tensor, int]:
        return self.batch_nll(model, self.batch(indices, next(model.parameters()).device))

    def mean_nll(self, model: torch.nn.Module, batch_size: int = 16) -> float:
        """Token-weighted mean NLL over all pairs (the hyper-validation loss)."""
        return mean_nlls([(self, model)], batch_size)[0]


@torch.no_grad()
def mean_nlls(pairs: Sequence[tuple[TokenObjective, torch.nn.Module]], batch_size: int = 16) -> list[float]:
    """``objective.mean_nll(model)`` of each (objective, model), in eval mode; objectives with
    the same ``share_key`` read each batch once."""
    states = [model.training for _, model in pairs]
    for _, model in pairs:
        model.eval()
    totals, counts = [0.0] * len(pairs), [0] * len(pairs)
    for start in range(0, max(len(objective) for objective, _ in pairs), batch_size):
        shared = {}
        for i, (objective, model) in enumerate(pairs):
            if start >= len(objective):
                continue
            indices = range(start, min(start + batch_size, len(objective)))
            key = (objective.share_key(), next(model.parameters()).device)
            if key not in shared:
                shared[key] = objective.batch(indices, key[1])
            loss, n = objective.batch_nll(model, shared[key])
            totals[i], counts[i] = totals[i] + loss.item(), counts[i] + n
    for (_, model), training in zip(pairs, states):
        model.train(training)
    return [total / count for total, count in zip(totals, counts)]


@torch.no_grad()
def mean_nlls_of_rules(objective: TokenObjective, model: torch.nn.Module,
                       rules: Callable[[torch.Tensor | None, torch.Tensor], Iterable[torch.Tensor]],
                       batch_size: int = 16) -> list[float]:
    """Token-weighted mean NLL over ``objective``'s pairs of each way ``rules`` combines the base
    with ``model``, which runs once per batch (not once per rule). ``rules(base_log_probs,
    small_logits)`` yields one tensor of log-probabilities per rule, in eval mode; each rule's
    mean is what ``mean_nll`` gives with that rule as the objective's ``log_probs``."""
    training, totals, count = model.training, [], 0
    model.eval()
    device = next(model.parameters()).device
    for start in range(0, len(objective), batch_size):
        batch = objective.batch(range(start, min(start + batch_size, len(objective))), device)
        small = reweighter_logits(model, batch["input_ids"], batch["attention_mask"], batch["positions"])
        losses = [F.nll_loss(log_probs, batch["targets"], reduction="sum").item()
                  for log_probs in rules(batch["base"], small)]
        totals = [a + b for a, b in zip(totals, losses)] if totals else [0.0 + loss for loss in losses]
        count += batch["targets"].numel()
    model.train(training)
    if not count:
        raise ValueError("No target tokens to score: the objective's pairs are empty.")
    return [total / count for total in totals]


@dataclass
class TrainConfig:
    lr: float = 5e-4
    weight_decay: float = 0.01
    max_epochs: int = 80
    patience: int = 5
    batch_size: int = 8
    warmup_ratio: float = 0.1
    seed: int = 0
    max_grad_norm: float | None = None
    # "bfloat16": run the small model's forward/backward under autocast (the combination and
    # the loss stay in float32). Several times faster on CPUs with AMX/AVX512-BF16.
    autocast: str | None = None


@dataclass
class FitResult:
    best_epoch: int
    best_val_loss: float
    epochs_run: int
    optimizer_steps: int
    seconds: float
    history: list[dict] = field(default_factory=list)
    stacked: bool = False  # stepped in a stack (core.stacked) for at least one epoch


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


CHECKPOINT_EVERY_S = 600.0


@dataclass
class GridRun:
    """One configuration of a grid for ``fit_grid``: its model, objectives, settings and
    checkpoint file (``fit``'s arguments)."""

    model: torch.nn.Module
    train: TokenObjective
    val: TokenObjective
    cfg: TrainConfig
    checkpoint: str | Path | None = None
    keep_checkpoint: bool = False


def fit(
    model: torch.nn.Module,
    train: TokenObjective,
    val: TokenObjective,
    cfg: TrainConfig,
    *,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    keep_checkpoint: bool = False,
) -> FitResult:
    """Train ``model`` (only its parameters) on ``train``; keep the epoch with the lowest ``val`` loss.

    With ``checkpoint``, the whole training state (weights, optimiser, schedule, random
    generators, the best epoch so far, the history) is written there at the end of an epoch
    once ``checkpoint_every_s`` seconds have passed since the last write, and a checkpoint found
    there from the same configuration, data sizes and device type is resumed from: an
    interrupted training ends exactly as an uninterrupted one. When training ends the file is
    removed, or with ``keep_checkpoint`` replaced by the finished result, which a later call
    returns without training (for a caller that stores its own result later: it removes the
    file then). The caller names the file after everything else the training depends on (the
    data, the model, the hyperparameters outside ``cfg``).
    """
    run = GridRun(model, train, val, cfg, checkpoint, keep_checkpoint)
    return fit_grid([run], progress=progress, checkpoint_every_s=checkpoint_every_s)[0]


def fit_grid(runs: Sequence[GridRun], *, progress: bool = True, checkpoint_every_s: float = CHECKPOINT_EVERY_S,
             stack: bool = False) -> list[FitResult]:
    """``fit`` for several configurations at once, in one pass over the data: each batch is
    read, and the base's output layer applied (``TokenObjective.batch``), once for all.

    The runs must share the seed, the batch size and the training pairs (so the data order),
    as the configurations of a grid do; each keeps its own model, optimiser, schedule, random
    generator, early stopping and checkpoint, and stops on its own. Each result equals what
    ``fit`` gives that run alone (tests/test_fused_training.py). Runs resumed from checkpoints
    at different epochs train in groups, one group per epoch reached. With ``stack``, runs whose
    models have the same shape also run their forward and backward as one (``core.stacked``),
    where the host's dispatching of each model's operations sets the pace (a GPU)."""
    if not runs:
        return []
    first = runs[0]
    for run in runs:
        same = (run.cfg.seed, run.cfg.batch_size, run.cfg.autocast, len(run.train))
        if same != (first.cfg.seed, first.cfg.batch_size, first.cfg.autocast, len(first.train)):
            raise ValueError("fit_grid trains configurations that share the seed, batch size, autocast and "
                             f"training pairs; got {same} beside {(first.cfg.seed, first.cfg.batch_size)}.")
        run.train.check_model(run.model)
        run.val.check_model(run.model)
    states = [_RunState(run) for run in runs]
    groups: dict[tuple, list[_RunState]] = {}
    for state in states:
        if state.result is None:
            order = state.resumed["order_rng"].numpy().tobytes() if state.resumed else b""
            groups.setdefault((len(state.history), order), []).append(state)
    for group in groups.values():
        _train_together(group, progress, checkpoint_every_s, stack)
    for run in runs:
        if run.checkpoint is not None and not run.keep_checkpoint:
            Path(run.checkpoint).unlink(missing_ok=True)
    return [state.result for state in states]


def grid_pays(device: torch.device, cache: BaseOutputCache | None) -> bool:
    """Whether training configurations together (``fit_grid``) saves time here: on a GPU, or where
    each batch costs the output layer's product (a compact cache). Measured with
    benchmarks/bench_fused.py (12 configurations, LLaMA-3.1-8B-shaped output layer): on an H200
    x1.30 compact and x1.18 full; on a 2-core CPU x3.36 compact, but x0.89 full, where reading a
    batch is a copy and the grid's larger working memory costs more than it saves."""
    return device.type == "cuda" or (cache is not None and cache.layout == "compact")


def configs_that_fit(model: torch.nn.Module, pending: int) -> int:
    """How many of ``pending`` configurations of ``model``'s size ``fit_grid`` can train at once
    on its device: each is a model, its gradients, AdamW's two moments and its best weights (20
    bytes a parameter), within the GPU's free memory less its headroom, or half the host's."""
    per_config = 20 * sum(p.numel() for p in model.parameters())
    device = next(model.parameters()).device
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        room = free - gpu_headroom(total)
    else:
        room = host_available_bytes() // 2
    return max(1, min(pending, int(room // per_config)))


class _RunState:
    """One run's training state inside ``fit_grid`` (what ``fit``'s checkpoint holds)."""

    def __init__(self, run: GridRun):
        self.run, cfg = run, run.cfg
        self.device_type = next(run.model.parameters()).device.type
        self.identity = {"config": asdict(cfg), "train_pairs": len(run.train), "val_pairs": len(run.val),
                         "device": self.device_type}
        self.resumed = load_checkpoint(run.checkpoint, self.identity)
        self.result: FitResult | None = None
        self.best_loss, self.best_epoch, self.best_state, self.stale, self.steps = math.inf, 0, None, 0, 0
        self.stacked = False
        self.history: list[dict] = []
        self.spent = self.resumed["seconds"] if self.resumed is not None else 0.0
        if self.resumed is not None and self.resumed["finished"]:
            run.model.load_state_dict(self.resumed["best_state"])
            run.model.eval()
            self.result = FitResult(self.resumed["best_epoch"], self.resumed["best_loss"],
                                    len(self.resumed["history"]), self.resumed["steps"], self.resumed["seconds"],
                                    self.resumed["history"])
            return
        seed_everything(cfg.seed)
        self.params = [p for p in run.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        total_steps = math.ceil(len(run.train) / cfg.batch_size) * cfg.max_epochs
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, round(cfg.warmup_ratio * total_steps),
                                                         total_steps)
        self.autocast = torch.autocast(self.device_type, dtype=getattr(torch, cfg.autocast or "bfloat16"),
                                       enabled=cfg.autocast is not None)
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state() if self.device_type == "cuda" else None
        if self.resumed is not None:
            r = self.resumed
            run.model.load_state_dict(r["model"])
            self.optimizer.load_state_dict(r["optimizer"])
            self.scheduler.load_state_dict(r["scheduler"])
            self.cpu_rng, self.cuda_rng = r["torch_rng"], r["cuda_rng"]
            self.best_loss, self.best_epoch, self.best_state = r["best_loss"], r["best_epoch"], r["best_state"]
            self.stale, self.steps, self.history = r["stale"], r["steps"], r["history"]
        self.train_total, self.train_tokens = 0.0, 0

    def enter_rng(self) -> None:
        """This run's random generators become the global ones (dropout draws from them)."""
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)

    def leave_rng(self) -> None:
        self.cpu_rng = torch.get_rng_state()
        if self.cuda_rng is not None:
            self.cuda_rng = torch.cuda.get_rng_state()

    def step(self, batch: dict) -> None:
        run = self.run
        with self.autocast:
            loss_sum, n = run.train.batch_nll(run.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        (loss_sum / n).backward()
        self.update(loss_sum.item(), n)

    def update(self, loss_sum: float, tokens: int) -> None:
        """The optimiser's step on the gradients in place (this run's, or its slice of a stack's)."""
        if self.run.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.run.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        self.train_total, self.train_tokens = self.train_total + loss_sum, self.train_tokens + tokens

    def end_epoch(self, epoch: int, val_loss: float) -> bool:
        """Record the epoch; True when this run stops (patience spent)."""
        self.history.append({"epoch": epoch, "train_loss": self.train_total / self.train_tokens,
                             "val_loss": val_loss, "lr": self.scheduler.get_last_lr()[0]})
        self.train_total, self.train_tokens = 0.0, 0
        if val_loss < self.best_loss:
            self.best_loss, self.best_epoch, self.stale = val_loss, epoch, 0
            self.best_state = copy.deepcopy(self.run.model.state_dict())
            return False
        self.stale += 1
        return self.stale >= self.run.cfg.patience

    def checkpoint_state(self, finished: bool, seconds: float, order_rng: torch.Generator) -> dict:
        kept = {**self.identity, "finished": finished, "best_loss": self.best_loss, "best_epoch": self.best_epoch,
                "best_state": self.best_state, "steps": self.steps, "history": self.history, "seconds": seconds}
        if finished:
            return kept
        return {**kept, "model": self.run.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "stale": self.stale, "scheduler": self.scheduler.state_dict(), "torch_rng": self.cpu_rng,
                "cuda_rng": self.cuda_rng, "order_rng": order_rng.get_state()}

    def finish(self, seconds: float, order_rng: torch.Generator) -> None:
        run = self.run
        run.model.load_state_dict(self.best_state)
        run.model.eval()
        if run.checkpoint is not None:  # kept until the grid ends: a resume never retrains it alone
            save_atomically(run.checkpoint, self.checkpoint_state(True, seconds, order_rng))
        self.result = FitResult(self.best_epoch, self.best_loss, len(self.history), self.steps, seconds, self.history,
                                self.stacked)


def _train_together(group: list[_RunState], progress: bool, checkpoint_every_s: float, stack: bool) -> None:
    """Epochs of every run in ``group`` (all at the same epoch and data order), batch by batch."""
    lead = group[0]
    seed_everything(lead.run.cfg.seed)
    order_rng = torch.Generator().manual_seed(lead.run.cfg.seed)
    if lead.resumed is not None:
        order_rng.set_state(lead.resumed["order_rng"])
    swap = len(group) > 1  # alone, the run's generators are the global ones already
    if not swap:
        lead.enter_rng()
    device = next(lead.run.model.parameters()).device
    started = last_saved = time.perf_counter()
    done_epochs, last_epoch = len(lead.history), max(state.run.cfg.max_epochs for state in group)
    epochs = tqdm(range(done_epochs + 1, last_epoch + 1), desc="epochs" if not swap else f"epochs ({len(group)} "
                  "configurations)", disable=not progress, initial=done_epochs, total=last_epoch)
    active = list(group)
    for epoch in epochs:
        active = [state for state in active if epoch <= state.run.cfg.max_epochs]
        if not active:
            break
        for state in active:
            state.run.model.train()
        order = torch.randperm(len(lead.run.train), generator=order_rng).tolist()
        units = _step_units(active, stack)
        for start in range(0, len(order), lead.run.cfg.batch_size):
            indices, shared = order[start : start + lead.run.cfg.batch_size], {}
            for members, parameters in units:
                first = members[0]
                if swap:
                    first.enter_rng()
                key = first.run.train.share_key()
                if key not in shared:
                    with first.autocast:
                        shared[key] = first.run.train.batch(indices, device)
                if parameters is None:
                    first.step(shared[key])
                else:  # one forward and backward for all, then each member's own optimiser step
                    losses, tokens = parameters.losses_and_gradients(first.run.train, shared[key], first.autocast)
                    for state, loss in zip(members, losses):
                        state.update(loss, tokens)
                if swap:
                    first.leave_rng()
                    for state in members[1:]:  # one draw, as each would have drawn alone
                        state.cpu_rng, state.cuda_rng = first.cpu_rng, first.cuda_rng
        for _, parameters in units:
            if parameters is not None:
                parameters.release()
        if len(active) > 1 and all(isinstance(state.run.val, TokenObjective) for state in active):
            val_losses = mean_nlls([(state.run.val, state.run.model) for state in active])
        else:
            val_losses = [state.run.val.mean_nll(state.run.model) for state in active]
        stopped = [state for state, loss in zip(active, val_losses) if state.end_epoch(epoch, loss)]
        active = [state for state in active if state not in stopped]
        if not swap:
            lead.leave_rng()
        epochs.set_postfix(val=" ".join(f"{s.history[-1]['val_loss']:.3f}" for s in group if s.history),
                           active=len(active))
        for state in stopped + [s for s in active if epoch == s.run.cfg.max_epochs]:
            state.finish(state.spent + time.perf_counter() - started, order_rng)
        active = [state for state in active if state.result is None]
        if active and time.perf_counter() - last_saved >= checkpoint_every_s:
            for state in active:
                if state.run.checkpoint is not None:
                    save_atomically(state.run.checkpoint,
                                     state.checkpoint_state(False, state.spent + time.perf_counter() - started,
                                                            order_rng))
            last_saved = time.perf_counter()
    for state in active:  # the epoch loop ran out (every run at its cap)
        if state.result is None:
            state.finish(state.spent + time.perf_counter() - started, order_rng)


def _step_units(active: list[_RunState], stack: bool) -> list[tuple[list[_RunState], ParameterStack | None]]:
    """The runs of an epoch as units that step together: with ``stack``, those whose models,
    objectives, autocast and random generator states are equal become one ``ParameterStack``;
    every other run steps alone."""
    if not stack or len(active) < 2:
        return [([state], None) for state in active]
    groups: dict[tuple, list[_RunState]] = {}
    for state in active:
        signature, train = stack_signature(state.run.model), state.run.train
        if signature is None or type(train) is not TokenObjective:
            groups[("alone", id(state))] = [state]
            continue
        rng = state.cpu_rng.numpy().tobytes() + (state.cuda_rng.numpy().tobytes() if state.cuda_rng is not None else b"")
        groups.setdefault((signature, train.share_key(), train.log_probs, state.run.cfg.autocast, rng), []).append(state)
    units = []
    for members in groups.values():
        stacked = len(members) > 1
        for state in members:
            state.stacked |= stacked
        units.append((members, ParameterStack([s.run.model for s in members]) if stacked else None))
    return units
