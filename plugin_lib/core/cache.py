"""The frozen base's outputs on the training pairs, computed once: ``BaseOutputCache``.

Every epoch, seed, hyperparameter setting and method (Plugin, WeightedComb, TempNet) reads the
same base outputs, so the base runs once per pair. Two layouts hold them:

- ``full``: the base's log-probabilities at every target position, V values a token (float32,
  or float16 for a half-precision base). Reading is a copy. What a black box behind an API
  gives (its top-k log-probabilities filled in) can only be stored this way.
- ``compact``: for a model that runs in this process, its final hidden state at every target
  position (the output layer's input, d values a token, in the model's dtype: 4,096 for
  LLaMA-3.1-8B instead of 128,256), turned into exactly those log-probabilities when a batch is
  read, by the model's own output layer on its device (``blackbox.OutputHead``). The
  reweighting model still sees only the next-token distribution: nothing else leaves the
  cache, so it learns nothing a black box with logit access would not give it. Top-k views of
  one base read the same stored states (the view applies to the log-probabilities).

``choose_layout`` picks one (``layout="auto"``) and ``choose_placement`` where its rows live;
the build prints both.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .blackbox import BlackBoxLM, OutputHead
from .cache_files import current_umask, owner_tag, remove_stale_partials, reserve_disk_space
from .loss import target_positions
from .pairs import EncodedPair, collate

def _cache_key(base_name: str, pairs: Sequence[EncodedPair]) -> str:  # noqa: D103
    payload = json.dumps([base_name, [(p.input_ids, p.prompt_length) for p in pairs]])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


HALF_DTYPES = (torch.float16, torch.bfloat16)
PLACEMENTS = ("auto", "gpu", "pinned", "memory", "mmap")
LAYOUTS = ("auto", "full", "compact")
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
        if cache.head is not None and cache.head.device.type == "cuda":
            cache.head = cache.head.to("cpu")  # it holds the previous base's output layer
        _GPU_CACHES.discard(cache)
    if freed:
        torch.cuda.empty_cache()
    return freed


def _numpy_dtype(dtype: torch.dtype):
    """The numpy dtype that stores ``dtype``: bfloat16 as its raw 16 bits (numpy has none)."""
    return {torch.float16: np.float16, torch.bfloat16: np.uint16}.get(dtype, np.float32)


def _torch_rows(part: np.ndarray) -> torch.Tensor:
    """Stored rows as a tensor (uint16 holds bfloat16's bits); a memory-mapped (read-only) part
    is copied, an array made by indexing or concatenation is not."""
    if type(part) is not np.ndarray or not part.flags.writeable:
        part = np.array(part)
    if part.dtype == np.uint16:
        return torch.from_numpy(part.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(part)




def compact_supported(base: BlackBoxLM) -> bool:
    """Whether ``base`` runs in this process with a linear output layer (``layout="compact"``)."""
    return base.output_head() is not None


def choose_layout(full_bytes: int, *, device_type: str, compact: bool, host_available: int | None = None,
                  disk_free: int | None = None, host_share: float = 0.5) -> tuple[str, str]:
    """(layout, why) for a cache whose full layout takes ``full_bytes``.

    ``full`` where it is cheap: on a CPU, when it fits in ``host_share`` of the available host
    memory and in the free disk (reading a row is then a copy, while the compact layout
    multiplies it by the output layer: ``benchmarks/bench_cache.py`` measures both). ``compact``
    on a GPU, where the output layer costs little beside the reweighting model's step and the
    states fit on the device (a full LLaMA-3.1-8B cache of E2E is about 30 GiB), and on a CPU
    where the full one would not fit memory or disk. ``full`` always for a base without
    hidden states (behind an API). The memory numbers are arguments so that the rule is tested
    without a GPU (``measure_layout`` reads them)."""
    if not compact:
        return "full", "a black box that gives log-probabilities only"
    if device_type == "cuda":
        return "compact", "the base is on a GPU: its output layer is applied as batches are read"
    if host_available is not None and full_bytes > host_share * host_available:
        return "compact", (f"the full one ({full_bytes / GIB:,.1f} GiB) exceeds {host_share:.0%} of the "
                           f"available memory ({host_available / GIB:,.1f} GiB)")
    if disk_free is not None and full_bytes > disk_free:
        return "compact", f"the full one ({full_bytes / GIB:,.1f} GiB) exceeds the free disk ({disk_free / GIB:,.1f} GiB)"
    return "full", "it fits this CPU's memory, where reading it is a copy"


def measure_layout(base: BlackBoxLM, full_bytes: int, directory: Path | None) -> tuple[str, str]:
    """``choose_layout`` with this machine's free memory and disk."""
    disk_free = None
    if directory is not None:
        existing = next((p for p in [Path(directory), *Path(directory).parents] if p.exists()), None)
        disk_free = shutil.disk_usage(existing).free if existing is not None else None
    return choose_layout(full_bytes, device_type=base.device.type, compact=compact_supported(base),
                         host_available=host_available_bytes(), disk_free=disk_free)


class BaseOutputCache:
    """The base's outputs at every target position; pair i owns rows ``offsets[i]:offsets[i+1]``.

    ``full`` rows (``head`` None) are log_softmax of the base's logits, computed in float32 once
    (training never repeats it) and stored in float32, or float16 for a half-precision base
    (``cache_dtype``), whose logits carry no more precision than that: a loss from them equals
    one from re-running the base within 1e-3 nats per token in float16. ``compact`` rows are the
    base's final hidden states in its own dtype, and ``head`` (its output layer and view) turns
    them into float32 log-probabilities on read. ``placement`` says where the rows live
    (``choose_placement``); ``get`` returns log-probabilities on the rows' device (full) or the
    head's (compact).
    """

    def __init__(self, rows: torch.Tensor | np.ndarray, offsets: np.ndarray, placement: str | None = None,
                 head: OutputHead | None = None):
        self.rows = rows
        self.offsets = offsets
        self.head = head
        if placement is None:
            placement = "mmap" if isinstance(rows, np.ndarray) else (
                "gpu" if rows.is_cuda else "pinned" if rows.is_pinned() else "memory")
        self.placement = placement
        if placement == "gpu" or (head is not None and head.device.type == "cuda"):
            _GPU_CACHES.add(self)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def layout(self) -> str:
        return "full" if self.head is None else "compact"

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    @property
    def vocab_size(self) -> int:
        """Log-probabilities per row that ``get`` returns."""
        return int(self.rows.shape[1]) if self.head is None else self.head.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the stored rows, memory-mapped or not."""
        if isinstance(self.rows, np.ndarray):
            return {np.dtype(np.float16): torch.float16, np.dtype(np.uint16): torch.bfloat16}.get(
                self.rows.dtype, torch.float32)
        return self.rows.dtype

    def _log_probs(self, rows: torch.Tensor | np.ndarray) -> torch.Tensor:
        rows = _torch_rows(rows) if isinstance(rows, np.ndarray) else rows
        return rows if self.head is None else self.head.log_probs(rows)

    def get(self, indices: Sequence[int]) -> torch.Tensor:
        """Log-probabilities of the given pairs' target positions, concatenated in that order
        (matches ``positions`` order): the stored dtype (full) or float32 (compact)."""
        parts = [self.rows[self.offsets[i] : self.offsets[i + 1]] for i in indices]
        rows = np.concatenate(parts) if isinstance(self.rows, np.ndarray) else torch.cat(parts)
        return self._log_probs(rows)

    def get_rows(self, rows: Sequence[int]) -> torch.Tensor:
        """Log-probabilities of single rows (row indices, not pairs), e.g. each pair's first."""
        index = list(rows)
        return self._log_probs(self.rows[index] if isinstance(self.rows, np.ndarray) else self.rows[index])

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
            part = _torch_rows(part) if isinstance(part, np.ndarray) else part
            rows[lo : lo + step] = part.to(rows.device)
        return BaseOutputCache(rows, self.offsets, placement, self.head)

    @staticmethod
    def stored_path(directory: str | Path, base: BlackBoxLM | str, pairs: Sequence[EncodedPair],
                    layout: str = "full") -> Path:
        """Where :meth:`build` stores the cache of ``base`` on ``pairs`` in ``directory``: the
        full layout under the box's name; the compact one under the model whose states it holds
        (its views share them) and their dtype."""
        if layout == "full":
            name = base if isinstance(base, str) else base.name
            return Path(directory) / f"base-{_cache_key(name, pairs)}.npy"
        if isinstance(base, str):
            raise TypeError("The compact layout's file is named after the base's model and dtype: pass the base.")
        dtype = str(base.dtype).removeprefix("torch.")
        return Path(directory) / f"base-{_cache_key(base.states_name, pairs)}.hidden-{dtype}.npy"

    @classmethod
    def is_stored(cls, directory: str | Path, base, pairs: Sequence[EncodedPair]) -> bool:
        """Whether ``directory`` holds ``base``'s cache on ``pairs`` in either layout. Reads only
        ``base.name`` and ``base.states_name``, so a base known by name (the grid's plan) will do."""
        if cls.stored_path(directory, base.name, pairs).exists():
            return True
        return any(Path(directory).glob(f"base-{_cache_key(base.states_name, pairs)}.hidden-*.npy"))

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
        layout: str = "auto",
    ) -> "BaseOutputCache":
        """Run the base once over ``pairs``; with ``directory``, store on disk (and reuse it).

        ``layout`` ("auto": ``measure_layout``; a stored cache of either layout is reused) says
        what is stored, ``placement`` ("auto": ``measure_placement``) where the rows live
        afterwards. Without a directory a CPU cache lives in memory and refuses to grow past
        ``max_memory_gb``: pass a directory for larger data (it is then memory-mapped).
        """
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        counts = np.array([p.target_length for p in pairs], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts)))
        full_dtype = cache_dtype(base.dtype)
        full_bytes = int(offsets[-1]) * base.vocab_size * torch.empty((), dtype=full_dtype).element_size()
        head = base.output_head() if layout != "full" else None
        if layout == "compact" and head is None:
            raise ValueError(f"{base.name} gives log-probabilities only (no output layer here): use layout 'full'.")
        if directory is not None:  # a stored cache of either layout is reused
            stored = cls._stored(base, pairs, directory, offsets, head, layout, placement)
            if stored is not None:
                return stored
        why = "as asked (a profile's cache_layout)"
        if layout == "auto":
            layout, why = measure_layout(base, full_bytes, directory)
        if layout == "full":
            head = None
        torch_dtype = full_dtype if head is None else base.dtype
        shape = (int(offsets[-1]), base.vocab_size if head is None else head.width)
        nbytes = shape[0] * shape[1] * torch.empty((), dtype=torch_dtype).element_size()
        if placement == "auto":
            placement = measure_placement(nbytes, base.device, directory is not None)
        if progress:  # beside the progress bars, on stderr: a command's stdout is its result
            print(f"base-output cache of {base.name} on {len(pairs):,} pairs: layout {layout} ({why}), "
                  f"{_size(nbytes)} (full: {_size(full_bytes)}), placement {placement}", file=sys.stderr, flush=True)
        path = cls.stored_path(directory, base, pairs, layout) if directory is not None else None
        rows, tmp = _allocate(path, shape, torch_dtype, placement, base.device, max_memory_gb)
        try:
            _fill(rows, base, pairs, offsets, head, torch_dtype, batch_size, progress, tmp)
            if path is not None:
                rows.flush()
                del rows
                if path.exists():  # another process finished the same cache meanwhile: use it
                    tmp.unlink()
                else:
                    os.replace(tmp, path)  # only a complete cache ever carries the final name
                tmp = None
                return cls(np.load(path, mmap_mode="r"), offsets, head=head).placed(placement, base.device)
        except BaseException:
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # a full disk or Ctrl-C leaves no partial file behind
            raise
        return cls(rows, offsets, placement, head)

    @classmethod
    def _stored(cls, base, pairs, directory, offsets, head, layout: str, placement: str) -> "BaseOutputCache | None":
        """A stored cache of ``base`` on ``pairs`` in a layout ``layout`` allows, placed; else None."""
        for kind in ("full", "compact") if head is not None else ("full",):
            path = cls.stored_path(directory, base, pairs, kind)
            if path.exists() and layout in ("auto", kind):
                rows = np.load(path, mmap_mode="r")
                where = placement if placement != "auto" else measure_placement(rows.nbytes, base.device, True)
                return cls(rows, offsets, head=head if kind == "compact" else None).placed(where, base.device)
        return None


def _allocate(path: Path | None, shape: tuple[int, int], torch_dtype: torch.dtype, placement: str,
              device: torch.device, max_memory_gb: float):
    """(the rows to fill, the temporary file they map or None): a memory-mapped file beside
    ``path`` (its disk space reserved first), else GPU, pinned or plain host memory."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(path.parent)
        # A name unique to this build: two processes building the same cache never write
        # into one file; whichever finishes first gives the final name its content.
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{owner_tag()}.", suffix=".partial")
        os.close(fd)
        tmp = Path(name)
        try:
            os.chmod(tmp, 0o666 & ~current_umask())  # the user's normal permissions, not mkstemp's 0600
            rows = np.lib.format.open_memmap(tmp, mode="w+", dtype=_numpy_dtype(torch_dtype), shape=shape)
            reserve_disk_space(tmp)  # open_memmap leaves the file sparse: reserve it before any write
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return rows, tmp
    nbytes = shape[0] * shape[1] * torch.empty((), dtype=torch_dtype).element_size()
    if placement == "gpu":
        return torch.empty(shape, dtype=torch_dtype, device=device), None
    if placement == "mmap" or (placement == "memory" and nbytes > max_memory_gb * GIB):
        raise MemoryError(
            f"The base-output cache needs {nbytes / GIB:.1f} GiB, over max_memory_gb="
            f"{max_memory_gb}. Pass directory=... to keep it in a memory-mapped file on disk."
        )
    return torch.empty(shape, dtype=torch_dtype, pin_memory=placement == "pinned"), None


def _fill(rows, base: BlackBoxLM, pairs: Sequence[EncodedPair], offsets: np.ndarray, head, torch_dtype: torch.dtype,
          batch_size: int, progress: bool, tmp: Path | None) -> None:
    """The base's outputs at every target position of ``pairs``, batch by batch, into ``rows``:
    log-probabilities (no ``head``) or final hidden states."""
    for start in tqdm(range(0, len(pairs), batch_size), desc="base outputs", disable=not progress):
        idx = list(range(start, min(start + batch_size, len(pairs))))
        batch = collate([pairs[i] for i in idx], base.tokenizer.pad_token_id)
        at = (batch["input_ids"], batch["attention_mask"], target_positions(batch["labels"]))
        if head is None:
            chunk = _to_cache_dtype(F.log_softmax(base.logits_at(*at).float(), dim=-1), torch_dtype)
        else:
            chunk = base.hidden_at(*at)
        lo, hi = offsets[idx[0]], offsets[idx[-1] + 1]
        if isinstance(rows, np.ndarray):
            chunk = chunk.cpu()
            bf16 = chunk.dtype == torch.bfloat16  # stored as its bits
            rows[lo:hi] = chunk.view(torch.int16).numpy().view(np.uint16) if bf16 else chunk.numpy()
        else:
            rows[lo:hi] = chunk.to(rows.device)
        if tmp is not None:
            os.utime(tmp)  # alive: remove_stale_partials leaves a file touched this recently


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:,.2f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:,.1f} MiB"


def _to_cache_dtype(log_probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 log-probabilities in the cache's dtype; in float16, finite values below its
    range are clamped to its lowest finite value (-inf, a token a top-k view rules out, stays)."""
    if dtype == torch.float16:
        lowest = torch.finfo(torch.float16).min
        log_probs = torch.where(log_probs.isneginf(), log_probs, log_probs.clamp(min=lowest))
    return log_probs.to(dtype)
