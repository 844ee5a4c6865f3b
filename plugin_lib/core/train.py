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
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

# The pairs and the cache have modules of their own; their names stay importable from here.
from .cache import (GIB, LAYOUTS, PLACEMENTS, BaseOutputCache, cache_dtype, choose_layout,  # noqa: F401
                    choose_placement, gpu_free_bytes, gpu_headroom, host_available_bytes, measure_placement,
                    release_gpu_caches)
from .cache_files import current_umask
from .loss import shift_labels, target_positions
from .pairs import EncodedPair, collate, encode_pairs  # noqa: F401
from .reweighter import check_token_ids, check_vocabulary, reweighter_logits

LogProbs = Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor]


def plugin_log_probs(base_log_probs: torch.Tensor, small_logits: torch.Tensor) -> torch.Tensor:
    """``combine_log_probs`` for a base that is already normalised (the cache's rows)."""
    return F.log_softmax(base_log_probs.float() + F.log_softmax(small_logits.float(), dim=-1), dim=-1)


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

    def nll(self, model: torch.nn.Module, indices: Sequence[int]) -> tuple[torch.Tensor, int]:
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in collate([self.pairs[i] for i in indices], self.pad_token_id).items()}
        positions = target_positions(batch["labels"])
        small = reweighter_logits(model, batch["input_ids"], batch["attention_mask"], positions)
        base = self.cache.get(indices).to(device) if self.cache is not None else None
        targets = shift_labels(batch["labels"])[positions]
        loss = F.nll_loss(self.log_probs(base, small), targets, reduction="sum")
        return loss, targets.numel()

    @torch.no_grad()
    def mean_nll(self, model: torch.nn.Module, batch_size: int = 16) -> float:
        """Token-weighted mean NLL over all pairs (the hyper-validation loss)."""
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for start in range(0, len(self), batch_size):
            loss, n = self.nll(model, range(start, min(start + batch_size, len(self))))
            total, count = total + loss.item(), count + n
        model.train(was_training)
        return total / count


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


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


CHECKPOINT_EVERY_S = 600.0


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
    train.check_model(model)
    val.check_model(model)
    device_type = next(model.parameters()).device.type
    identity = {"config": asdict(cfg), "train_pairs": len(train), "val_pairs": len(val), "device": device_type}
    resumed = _load_checkpoint(checkpoint, identity)
    if resumed is not None and resumed["finished"]:
        model.load_state_dict(resumed["best_state"])
        model.eval()
        return FitResult(resumed["best_epoch"], resumed["best_loss"], len(resumed["history"]), resumed["steps"],
                         resumed["seconds"], resumed["history"])
    seed_everything(cfg.seed)
    order_rng = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.max_epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total_steps), total_steps)

    autocast = torch.autocast(
        device_type, dtype=getattr(torch, cfg.autocast or "bfloat16"), enabled=cfg.autocast is not None
    )
    best_loss, best_epoch, best_state, stale, steps = math.inf, 0, None, 0, 0
    history: list[dict] = []
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        torch.set_rng_state(resumed["torch_rng"])
        if resumed["cuda_rng"] is not None:
            torch.cuda.set_rng_state(resumed["cuda_rng"])
        order_rng.set_state(resumed["order_rng"])
        best_loss, best_epoch, best_state = resumed["best_loss"], resumed["best_epoch"], resumed["best_state"]
        stale, steps, history = resumed["stale"], resumed["steps"], resumed["history"]
    spent = resumed["seconds"] if resumed is not None else 0.0
    started = last_saved = time.perf_counter()

    def state(finished: bool) -> dict:
        kept = {**identity, "finished": finished, "best_loss": best_loss, "best_epoch": best_epoch,
                "best_state": best_state, "steps": steps, "history": history,
                "seconds": spent + time.perf_counter() - started}
        if finished:
            return kept
        return {**kept, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "stale": stale,
                "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state() if device_type == "cuda" else None,
                "order_rng": order_rng.get_state()}

    epochs = tqdm(range(len(history) + 1, cfg.max_epochs + 1), desc="epochs", disable=not progress,
                  initial=len(history), total=cfg.max_epochs)
    for epoch in epochs:
        model.train()
        order = torch.randperm(len(train), generator=order_rng).tolist()
        train_total, train_tokens = 0.0, 0
        for start in range(0, len(order), cfg.batch_size):
            with autocast:
                loss_sum, n = train.nll(model, order[start : start + cfg.batch_size])
            optimizer.zero_grad(set_to_none=True)
            (loss_sum / n).backward()
            if cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            steps += 1
            train_total, train_tokens = train_total + loss_sum.item(), train_tokens + n
        val_loss = val.mean_nll(model)
        history.append(
            {
                "epoch": epoch,
                "train_loss": train_total / train_tokens,
                "val_loss": val_loss,
                "lr": scheduler.get_last_lr()[0],
            }
        )
        epochs.set_postfix(train=f"{train_total / train_tokens:.3f}", val=f"{val_loss:.3f}")
        if val_loss < best_loss:
            best_loss, best_epoch, stale = val_loss, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
            if stale >= cfg.patience:
                break
        if checkpoint is not None and epoch < cfg.max_epochs and time.perf_counter() - last_saved >= checkpoint_every_s:
            _save_atomically(checkpoint, state(finished=False))
            last_saved = time.perf_counter()
    model.load_state_dict(best_state)
    model.eval()
    seconds = spent + time.perf_counter() - started
    if checkpoint is not None and keep_checkpoint:
        _save_atomically(checkpoint, {**state(finished=True), "seconds": seconds})
    elif checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)
    return FitResult(best_epoch, best_loss, len(history), steps, seconds, history)


def _save_atomically(path: str | Path, state: dict) -> None:
    """``torch.save`` into a temporary beside ``path``, flushed and renamed when complete: a
    kill mid-write leaves the previous checkpoint whole. (The core keeps its own writer rather
    than ``utils.io``'s: it imports nothing outside the core; the harness reaps temporaries.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # the user's normal permissions, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_checkpoint(path: str | Path | None, identity: dict) -> dict | None:
    """The training state kept at ``path`` by ``fit``, if there is a readable one of this
    configuration, data and device type (an unreadable one is trained over, with a warning)."""
    if path is None or not Path(path).exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many kinds for a damaged file
        warnings.warn(f"The training checkpoint {path} cannot be read ({err}); training from the start.")
        return None
    return state if all(state.get(k) == v for k, v in identity.items()) else None


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
