"""Training a reweighting model against a frozen base.

The pieces, smallest first:
- ``encode_pairs`` / ``collate``: (prompt, target) pairs as token ids, left padded, with labels
  that are -100 on prompt and padding (target truncated to 127 tokens, then EOS).
- ``BaseOutputCache``: the frozen base's log-probabilities at the target positions of every pair,
  computed once and reused by every epoch, seed, hyperparameter setting and method (Plugin,
  WeightedComb and TempNet all need the same base outputs). In memory up to a budget, or in a
  memory-mapped file on disk that later runs reuse.
- ``TokenObjective``: summed token NLL of a batch for one method (how base and small-model
  logits combine).
- ``fit``: AdamW, linear warmup then linear decay counted in optimiser steps, early stopping on
  hyper-validation loss with patience, best weights restored; seeded and deterministic.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from .blackbox import BlackBoxLM
from .loss import IGNORE_INDEX, shift_labels, target_positions
from .reweighter import reweighter_logits


@dataclass(frozen=True)
class EncodedPair:
    input_ids: tuple[int, ...]  # prompt tokens, then target tokens and EOS
    prompt_length: int

    @property
    def target_length(self) -> int:
        return len(self.input_ids) - self.prompt_length


def encode_pairs(
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    max_prompt_tokens: int = 128,
    max_target_tokens: int = 127,
) -> list[EncodedPair]:
    """Token ids of each prompt (its last ``max_prompt_tokens``) + target (first 127) + EOS.

    The prompt keeps its end because that is what the target continues from.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    prompt_ids = tokenizer(list(prompts))["input_ids"]
    target_ids = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    pairs = []
    for p, t in zip(prompt_ids, target_ids):
        p = p[-max_prompt_tokens:]
        t = t[:max_target_tokens] + [tokenizer.eos_token_id]
        pairs.append(EncodedPair(tuple(p + t), len(p)))
    return pairs


def collate(pairs: Sequence[EncodedPair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off target)."""
    width = max(len(p.input_ids) for p in pairs)
    input_ids = torch.full((len(pairs), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORE_INDEX, dtype=torch.long)
    for row, pair in enumerate(pairs):
        start = width - len(pair.input_ids)
        input_ids[row, start:] = torch.tensor(pair.input_ids)
        attention_mask[row, start:] = 1
        labels[row, start + pair.prompt_length :] = torch.tensor(pair.input_ids[pair.prompt_length :])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


STALE_PARTIAL_S = 3600


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_partials(directory: Path, max_age_s: float = STALE_PARTIAL_S) -> list[Path]:
    """Remove ``.base-*.partial`` files in ``directory`` untouched for ``max_age_s`` seconds:
    caches whose build was killed (a live build touches its file after every batch)."""
    removed, cutoff = [], time.time() - max_age_s
    for partial in Path(directory).glob(".base-*.partial"):
        try:
            if partial.stat().st_mtime < cutoff:
                partial.unlink()
                removed.append(partial)
        except FileNotFoundError:
            pass
    return removed


def _cache_key(base_name: str, pairs: Sequence[EncodedPair]) -> str:
    payload = json.dumps([base_name, [(p.input_ids, p.prompt_length) for p in pairs]])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


class BaseOutputCache:
    """The base model's log-probabilities at every target position; pair i owns rows
    ``offsets[i]:offsets[i+1]``.

    Rows are log_softmax of the base's logits, computed in float32 once here (so training
    never repeats it) and stored in float32, or float16 for a float16 base whose logits carry
    no more precision than that. A loss from the cache equals one from re-running the base.
    """

    def __init__(self, rows: torch.Tensor | np.ndarray, offsets: np.ndarray):
        self.rows = rows
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def get(self, indices: Sequence[int]) -> torch.Tensor:
        """Rows of the given pairs, concatenated in that order (matches ``positions`` order)."""
        parts = [self.rows[self.offsets[i] : self.offsets[i + 1]] for i in indices]
        if isinstance(self.rows, np.ndarray):
            return torch.from_numpy(np.concatenate(parts))
        return torch.cat(parts)

    @classmethod
    def build(
        cls,
        base: BlackBoxLM,
        pairs: Sequence[EncodedPair],
        *,
        directory: str | Path | None = None,
        max_memory_gb: float = 4.0,
        batch_size: int = 8,
        progress: bool = True,
    ) -> "BaseOutputCache":
        """Run the base once over ``pairs``; with ``directory``, store on disk (and reuse it).

        Without a directory the cache lives in memory and refuses to grow past
        ``max_memory_gb``: pass a directory for larger data (it is then memory-mapped).
        """
        counts = np.array([p.target_length for p in pairs], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts)))
        torch_dtype = torch.float16 if base.dtype == torch.float16 else torch.float32
        dtype = np.float16 if torch_dtype == torch.float16 else np.float32
        shape = (int(offsets[-1]), base.vocab_size)
        nbytes = shape[0] * shape[1] * np.dtype(dtype).itemsize
        path = tmp = None
        if directory is not None:
            path = Path(directory) / f"base-{_cache_key(base.name, pairs)}.npy"
            if path.exists():
                return cls(np.load(path, mmap_mode="r"), offsets)
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_partials(path.parent)
            # A name unique to this build: two processes building the same cache never write
            # into one file; whichever finishes first gives the final name its content.
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
            os.close(fd)
            tmp = Path(name)
            try:
                os.chmod(tmp, 0o666 & ~_umask())  # the user's normal permissions, not mkstemp's 0600
                rows = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        elif nbytes > max_memory_gb * 2**30:
            raise MemoryError(
                f"The base-output cache needs {nbytes / 2**30:.1f} GiB, over max_memory_gb="
                f"{max_memory_gb}. Pass directory=... to keep it in a memory-mapped file on disk."
            )
        else:
            rows = torch.empty(shape, dtype=torch_dtype)
        try:
            order = range(0, len(pairs), batch_size)
            for start in tqdm(order, desc="base outputs", disable=not progress):
                idx = list(range(start, min(start + batch_size, len(pairs))))
                batch = collate([pairs[i] for i in idx], base.tokenizer.pad_token_id)
                logits = base.logits(batch["input_ids"], batch["attention_mask"])
                selected = logits[target_positions(batch["labels"]).to(logits.device)]
                chunk = F.log_softmax(selected.float(), dim=-1).to(torch_dtype).cpu()
                lo, hi = offsets[idx[0]], offsets[idx[-1] + 1]
                if isinstance(rows, np.ndarray):
                    rows[lo:hi] = chunk.numpy()
                else:
                    rows[lo:hi] = chunk
                if tmp is not None:
                    os.utime(tmp)  # alive: remove_stale_partials leaves a file touched this recently
            if path is not None:
                rows.flush()
                del rows
                if path.exists():  # another process finished the same cache meanwhile: use it
                    tmp.unlink()
                else:
                    os.replace(tmp, path)  # only a complete cache ever carries the final name
                tmp = None
                return cls(np.load(path, mmap_mode="r"), offsets)
        except BaseException:
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # a full disk or Ctrl-C leaves no partial file behind
            raise
        return cls(rows, offsets)


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


def fit(
    model: torch.nn.Module,
    train: TokenObjective,
    val: TokenObjective,
    cfg: TrainConfig,
    *,
    progress: bool = True,
) -> FitResult:
    """Train ``model`` (only its parameters) on ``train``; keep the epoch with the lowest ``val`` loss."""
    seed_everything(cfg.seed)
    order_rng = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.max_epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total_steps), total_steps)

    device_type = next(model.parameters()).device.type
    autocast = torch.autocast(
        device_type, dtype=getattr(torch, cfg.autocast or "bfloat16"), enabled=cfg.autocast is not None
    )
    best_loss, best_epoch, best_state, stale, steps = math.inf, 0, None, 0, 0
    history: list[dict] = []
    started = time.perf_counter()
    epochs = tqdm(range(1, cfg.max_epochs + 1), desc="epochs", disable=not progress)
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
    model.load_state_dict(best_state)
    model.eval()
    return FitResult(best_epoch, best_loss, len(history), steps, time.perf_counter() - started, history)


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
