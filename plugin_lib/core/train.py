"""Training a reweighting model against a frozen base.

The pieces, smallest first:
- ``encode_pairs`` / ``collate``: (prompt, target) pairs as token ids, left padded, with labels
  that are -100 on prompt and padding (target truncated to 127 tokens, then EOS).
- ``BaseOutputCache``: the frozen base's log-probabilities at the target positions of every pair,
  computed once and reused by every epoch, seed, hyperparameter setting and method (Plugin,
  WeightedComb and TempNet all need the same base outputs). Stored in float16 for a
  half-precision base. On a GPU machine it is kept on the GPU when it fits beside the base,
  otherwise in pinned host memory, otherwise memory-mapped (``choose_placement``); on a CPU in
  memory up to a budget, or in a memory-mapped file on disk that later runs reuse.
- ``TokenObjective``: summed token NLL of a batch for one method (how base and small-model
  logits combine).
- ``fit``: AdamW, linear warmup then linear decay counted in optimiser steps, early stopping on
  hyper-validation loss with patience, best weights restored; seeded and deterministic.
"""
from __future__ import annotations

import copy
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from .blackbox import BlackBoxLM
from .loss import IGNORE_INDEX, shift_labels, target_positions
from .reweighter import check_token_ids, check_vocabulary, reweighter_logits


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


def reserve_disk_space(path: Path) -> None:
    """Give the (sparse) file ``path`` disk blocks for all its bytes now.

    A write into a memory-mapped page that a full disk cannot back kills the process with
    SIGBUS instead of raising, so a full disk must show before the first write, as an OSError
    that says what to do. Where the filesystem cannot allocate ahead, its free space is checked.
    """
    size = path.stat().st_size
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # not "unsupported here"
                raise _no_disk_space(path, size, err.strerror) from err
        finally:
            os.close(fd)
    if shutil.disk_usage(path.parent).free < size:
        raise _no_disk_space(path, size, "not enough free space")


def _no_disk_space(path: Path, size: int, reason: str) -> OSError:
    """The error for a cache file that does not fit; removes the file first, so that the free
    space it reports is what the disk has without it."""
    path.unlink(missing_ok=True)
    free = shutil.disk_usage(path.parent).free
    return OSError(
        errno.ENOSPC,
        f"The base-output cache needs {size / 2**20:,.1f} MiB on disk in {path.parent} but could not get it "
        f"({reason}; {free / 2**20:,.1f} MiB free). Free disk space there, or point PLUGIN_RESULTS_DIR "
        "(the runs and their cache folders) or the cache's directory=... at a larger disk, and run again.",
    )


def _cache_key(base_name: str, pairs: Sequence[EncodedPair]) -> str:
    payload = json.dumps([base_name, [(p.input_ids, p.prompt_length) for p in pairs]])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


HALF_DTYPES = (torch.float16, torch.bfloat16)
PLACEMENTS = ("auto", "gpu", "pinned", "memory", "mmap")
GIB = 2**30


def cache_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """float16 for a half-precision base (float16 or bfloat16), float32 otherwise.

    A half-precision base's logits carry no more precision than float16 holds (bfloat16 has
    fewer mantissa bits than float16), and log-probabilities lie in [-65504, 0], within
    float16's range; float16 halves the size of a float32 cache (a LLaMA-3 vocabulary: 256 KB
    instead of 513 KB per target token).
    """
    return torch.float16 if base_dtype in HALF_DTYPES else torch.float32


def gpu_headroom(gpu_total: int) -> int:
    """GPU memory left free beside the base and the caches: the reweighting model, its
    optimiser, activations, and the base's KV cache when decoding (15% of the GPU, >= 4 GiB)."""
    return max(4 * GIB, int(0.15 * gpu_total))


def choose_placement(
    nbytes: int, *, device_type: str, has_directory: bool, gpu_free: int | None = None,
    gpu_total: int | None = None, host_available: int | None = None, host_share: float = 0.5,
) -> str:
    """Where a cache of ``nbytes`` lives: ``"gpu"``, ``"pinned"``, ``"memory"`` or ``"mmap"``.

    With the base on a GPU: on the GPU when it fits in the free GPU memory less
    ``gpu_headroom``; otherwise in pinned (page-locked) host memory when it takes at most
    ``host_share`` of the available host memory; otherwise memory-mapped from its file (in
    memory when there is no directory to keep a file in). On a CPU: memory-mapped when there is a
    directory (the page cache keeps it in memory), otherwise in memory. The free-memory numbers
    are arguments so that the rule is tested without a GPU (``measure_placement`` reads them).
    """
    if device_type == "cuda":
        if gpu_free is not None and gpu_total is not None and nbytes <= gpu_free - gpu_headroom(gpu_total):
            return "gpu"
        if host_available is not None and nbytes <= host_share * host_available:
            return "pinned"
    return "mmap" if has_directory else "memory"


def host_available_bytes() -> int | None:
    """Host memory available to new allocations (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_free_bytes(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a GPU, counting memory torch holds in its cache but does not use."""
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def measure_placement(nbytes: int, device: torch.device, has_directory: bool) -> str:
    """``choose_placement`` with this machine's free GPU and host memory."""
    gpu_free = gpu_total = None
    if device.type == "cuda":
        gpu_free, gpu_total = gpu_free_bytes(device)
    return choose_placement(nbytes, device_type=device.type, has_directory=has_directory, gpu_free=gpu_free,
                            gpu_total=gpu_total, host_available=host_available_bytes())


_GPU_CACHES: "weakref.WeakSet[BaseOutputCache]" = weakref.WeakSet()


def release_gpu_caches() -> int:
    """Move every GPU-held cache still alive to host memory (pinned where it fits); returns
    the bytes freed on the GPU. ``harness.models`` calls it before loading a base on a GPU:
    a notebook loads the next base while the previous task, and its caches, are still
    referenced, and a cache sized to fill the GPU beside one base must not block the next."""
    freed = 0
    for cache in list(_GPU_CACHES):
        if cache.placement == "gpu":
            pinned = cache.nbytes <= 0.5 * (host_available_bytes() or 0)
            cache.rows = cache.rows.to("cpu").pin_memory() if pinned else cache.rows.to("cpu")
            cache.placement = "pinned" if pinned else "memory"
            freed += cache.nbytes
        _GPU_CACHES.discard(cache)
    if freed:
        torch.cuda.empty_cache()
    return freed


def _numpy_dtype(dtype: torch.dtype):
    return np.float16 if dtype == torch.float16 else np.float32


class BaseOutputCache:
    """The base model's log-probabilities at every target position; pair i owns rows
    ``offsets[i]:offsets[i+1]``.

    Rows are log_softmax of the base's logits, computed in float32 once here (so training
    never repeats it) and stored in float32, or float16 for a half-precision base (float16 or
    bfloat16: ``cache_dtype``), whose logits carry no more precision than that. A loss from
    the cache equals one from re-running the base (within 1e-3 nats per token in float16).
    ``placement`` says where the rows live (``choose_placement``); ``get`` returns them on
    that device.
    """

    def __init__(self, rows: torch.Tensor | np.ndarray, offsets: np.ndarray, placement: str | None = None):
        self.rows = rows
        self.offsets = offsets
        if placement is None:
            placement = "mmap" if isinstance(rows, np.ndarray) else (
                "gpu" if rows.is_cuda else "pinned" if rows.is_pinned() else "memory")
        self.placement = placement
        if placement == "gpu":
            _GPU_CACHES.add(self)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the rows (float16 or float32), memory-mapped or not."""
        if isinstance(self.rows, np.ndarray):
            return torch.float16 if self.rows.dtype == np.float16 else torch.float32
        return self.rows.dtype

    def get(self, indices: Sequence[int]) -> torch.Tensor:
        """Rows of the given pairs, concatenated in that order (matches ``positions`` order)."""
        parts = [self.rows[self.offsets[i] : self.offsets[i + 1]] for i in indices]
        if isinstance(self.rows, np.ndarray):
            return torch.from_numpy(np.concatenate(parts))
        return torch.cat(parts)

    def placed(self, placement: str, device: torch.device | str | None = None) -> "BaseOutputCache":
        """This cache with its rows moved to ``placement`` ("gpu" on ``device``, "pinned",
        "memory" or "mmap"), copied in chunks so that host memory never holds a second copy."""
        if placement == self.placement:
            return self
        if placement == "mmap":
            raise ValueError("A cache becomes memory-mapped only from its file: build it with directory=...")
        shape, dtype = tuple(self.rows.shape), self.dtype
        if placement == "gpu":
            rows = torch.empty(shape, dtype=dtype, device=device or "cuda")
        else:
            rows = torch.empty(shape, dtype=dtype, pin_memory=placement == "pinned")
        step = max(1, (256 * 2**20) // max(1, shape[1] * rows.element_size()))  # 256 MiB at a time
        for lo in range(0, shape[0], step):
            part = self.rows[lo : lo + step]
            part = torch.from_numpy(np.array(part)) if isinstance(part, np.ndarray) else part
            rows[lo : lo + step] = part.to(rows.device)
        return BaseOutputCache(rows, self.offsets, placement)

    @staticmethod
    def stored_path(directory: str | Path, base_name: str, pairs: Sequence[EncodedPair]) -> Path:
        """Where :meth:`build` stores the cache of ``base_name`` on ``pairs`` in ``directory``."""
        return Path(directory) / f"base-{_cache_key(base_name, pairs)}.npy"

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
        placement: str = "auto",
    ) -> "BaseOutputCache":
        """Run the base once over ``pairs``; with ``directory``, store on disk (and reuse it).

        ``placement`` ("auto": ``measure_placement``) says where the rows live afterwards.
        Without a directory a CPU cache lives in memory and refuses to grow past
        ``max_memory_gb``: pass a directory for larger data (it is then memory-mapped).
        """
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        counts = np.array([p.target_length for p in pairs], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts)))
        torch_dtype = cache_dtype(base.dtype)
        dtype = _numpy_dtype(torch_dtype)
        shape = (int(offsets[-1]), base.vocab_size)
        nbytes = shape[0] * shape[1] * np.dtype(dtype).itemsize
        if placement == "auto":
            placement = measure_placement(nbytes, base.device, directory is not None)
        path = tmp = None
        if directory is not None:
            path = cls.stored_path(directory, base.name, pairs)
            if path.exists():
                return cls(np.load(path, mmap_mode="r"), offsets).placed(placement, base.device)
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
                reserve_disk_space(tmp)  # open_memmap leaves the file sparse: reserve it before any write
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        elif placement == "gpu":
            rows = torch.empty(shape, dtype=torch_dtype, device=base.device)
        elif placement == "mmap" or (placement == "memory" and nbytes > max_memory_gb * GIB):
            raise MemoryError(
                f"The base-output cache needs {nbytes / GIB:.1f} GiB, over max_memory_gb="
                f"{max_memory_gb}. Pass directory=... to keep it in a memory-mapped file on disk."
            )
        else:
            rows = torch.empty(shape, dtype=torch_dtype, pin_memory=placement == "pinned")
        try:
            order = range(0, len(pairs), batch_size)
            for start in tqdm(order, desc="base outputs", disable=not progress):
                idx = list(range(start, min(start + batch_size, len(pairs))))
                batch = collate([pairs[i] for i in idx], base.tokenizer.pad_token_id)
                selected = base.logits_at(batch["input_ids"], batch["attention_mask"],
                                          target_positions(batch["labels"]))
                chunk = _to_cache_dtype(F.log_softmax(selected.float(), dim=-1), torch_dtype)
                lo, hi = offsets[idx[0]], offsets[idx[-1] + 1]
                if isinstance(rows, np.ndarray):
                    rows[lo:hi] = chunk.cpu().numpy()
                else:
                    rows[lo:hi] = chunk.to(rows.device)
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
                return cls(np.load(path, mmap_mode="r"), offsets).placed(placement, base.device)
        except BaseException:
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # a full disk or Ctrl-C leaves no partial file behind
            raise
        return cls(rows, offsets, placement)


def _to_cache_dtype(log_probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 log-probabilities in the cache's dtype; in float16, finite values below its
    range are clamped to its lowest finite value (-inf, a token a top-k view rules out, stays)."""
    if dtype == torch.float16:
        lowest = torch.finfo(torch.float16).min
        log_probs = torch.where(log_probs.isneginf(), log_probs, log_probs.clamp(min=lowest))
    return log_probs.to(dtype)


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
            check_vocabulary(self.cache.rows.shape[1], model)
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
        os.chmod(tmp, 0o666 & ~_umask())  # the user's normal permissions, not mkstemp's 0600
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
