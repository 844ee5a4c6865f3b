"""The concurrency curve: reweighting-model trainings from a compact cache, 1, 4, 8 and 12 at once.

``measure_shared`` starts k processes (spawned, one thread each), each training the family's
reweighting model from a compact base-output cache held on the device, through an output layer
of the base's shape (random: a rate does not depend on the values), as a unit of the grid trains
with the base's output layer alone (``grid.units.trains_from_cache``). After two warm-up steps
they wait at a barrier, then each takes ``steps`` AdamW steps; the aggregate rate is every
process's pairs over the time from the barrier to the last one's end. Every process trains the
same model on the same data from the same seeds, so every one must end with the same weights as
the process that trained alone: the digests are compared, and a curve whose digests differ is
not returned. The lone process also reports a step's host time (the Python side, without
waiting for the device) and, on a GPU, its device time (the kernels' time, from the profiler),
and every process its peak device memory.

``mps_server`` runs the same processes as clients of a private CUDA MPS daemon (its own pipe and
log folders, quit at the end), where the machine has ``nvidia-cuda-mps-control``: MPS runs the
clients' kernels side by side instead of in turns. ``benchmarks/bench_mps.py`` compares the two.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import queue
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...core.blackbox import OutputHead
from ...core.cache import BaseOutputCache
from ...core.pairs import EncodedPair
from ...core.reweighter import make_reweighter
from ...core.train import TokenObjective

GPU_COUNTS = (1, 4, 8, 12)
CPU_COUNTS = (1, 2)  # a rehearsal of the measurement on a CPU (gpu-check --device cpu), not a rate to plan with
CUDA_CONTEXT = 2**29  # what a CUDA context takes beside torch's allocations, about 0.5 GiB


@dataclass(frozen=True)
class Shape:
    """What a training process builds: the base's output layer (``vocab`` x ``hidden`` in
    ``dtype``), the family's reweighting model (``arch``), ``pairs`` of ``length`` tokens with
    ``targets`` target tokens each, trained at ``batch_size``."""

    vocab: int
    hidden: int
    dtype: str
    arch: tuple
    pairs: int
    length: int
    targets: int
    batch_size: int
    device: str


@dataclass(frozen=True)
class Curve:
    """Aggregate pairs/s by processes at once (string keys, as the rates file has them); the
    lone process's step in host and device milliseconds; the largest peak of a process; whether
    every process ended with the lone process's weights."""

    pairs_per_s: dict[str, float]
    host_ms: float
    device_ms: float | None
    peak_bytes: int | None
    digests_equal: bool


def _objective(shape: Shape) -> tuple[TokenObjective, torch.nn.Module]:
    torch.manual_seed(0)  # every run draws the same dropout masks, the lone process's second run too
    device = torch.device(shape.device)
    dtype = getattr(torch, shape.dtype)
    generator = torch.Generator().manual_seed(0)
    head = OutputHead((torch.randn(shape.vocab, shape.hidden, generator=generator) * 0.02).to(device, dtype), None)
    ids = torch.randint(3, min(shape.vocab, 49_152), (shape.pairs, shape.length), generator=generator)
    pairs = [EncodedPair(tuple(row.tolist()), shape.length - shape.targets) for row in ids]
    rows = torch.randn(shape.pairs * shape.targets, shape.hidden, generator=generator).to(device, dtype)
    cache = BaseOutputCache(rows, np.arange(shape.pairs + 1) * shape.targets, head=head)
    model = make_reweighter(vocab_size=shape.vocab, seed=0, **dict(shape.arch)).to(device)
    return TokenObjective(pairs, 0, cache=cache), model


def _train(shape: Shape, steps: int, barrier, results, index: int) -> None:
    """One process of the curve (module docstring); its result goes to ``results``."""
    torch.set_num_threads(1)
    objective, model = _objective(shape)
    device = torch.device(shape.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    batches = [list(range(i, i + shape.batch_size)) for i in range(0, shape.pairs - shape.batch_size + 1,
                                                                    shape.batch_size)]

    def step(k: int) -> None:
        loss, n = objective.batch_nll(model, objective.batch(batches[k % len(batches)], device))
        optimizer.zero_grad(set_to_none=True)
        (loss / n).backward()
        optimizer.step()

    for k in range(2):  # warm-up: allocations, kernel selection
        step(k)
    sync()
    host_ms = device_ms = None
    if index == 0 and barrier is None:  # the lone process: a step's host and device time
        timed = 8 if cuda else 2
        started = time.perf_counter()
        for k in range(timed):
            step(k)
        host_ms = (time.perf_counter() - started) / timed * 1000  # dispatch only on a GPU: nothing waits
        sync()
        if cuda:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for k in range(8):
                    step(k)
                sync()
            device_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 8 / 1000
        objective, model = _objective(shape)  # the timed run starts afresh, as the others do
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model.train()
        for k in range(2):
            step(k)
        sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    if barrier is not None:
        barrier.wait()
    started = time.perf_counter()
    for k in range(2, 2 + steps):
        step(k)
    sync()
    ended = time.perf_counter()
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    peak = torch.cuda.max_memory_reserved(device) + CUDA_CONTEXT if cuda else None
    results.put((index, started, ended, digest.hexdigest(), host_ms, device_ms, peak))


def at_once(shape: Shape, count: int, steps: int, *, env: Mapping[str, str] | None = None,
            timeout_s: float = 600.0) -> list[tuple]:
    """``count`` processes that train ``shape`` at once (module docstring), started with ``env``
    added to their environment (an MPS daemon's folders: ``mps_server``); a list of (index,
    start, end, digest, host ms, device ms, peak bytes), by index. A process that fails, or
    gives no result within ``timeout_s``, raises RuntimeError."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(count) if count > 1 else None
    processes = [context.Process(target=_train, args=(shape, steps, barrier, results, i), daemon=True)
                 for i in range(count)]
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})  # a spawned process takes the parent's environment as it starts
    try:
        for process in processes:
            process.start()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    try:
        found = [results.get(timeout=timeout_s) for _ in processes]
    except queue.Empty:
        raise RuntimeError(f"{count} training processes at once gave no result within {timeout_s:.0f} s "
                           f"(exit codes {[p.exitcode for p in processes]})") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
    if any(p.exitcode not in (0, None) for p in processes):
        raise RuntimeError(f"a training process of the concurrency curve failed (exit codes "
                           f"{[p.exitcode for p in processes]})")
    return sorted(found)


def mps_control() -> str | None:
    """The MPS control program where this machine has one (on PATH, or in the driver's folder of
    a container), else None."""
    found = shutil.which("nvidia-cuda-mps-control")
    fallback = Path("/usr/local/nvidia/bin/nvidia-cuda-mps-control")
    return found or (str(fallback) if os.access(fallback, os.X_OK) else None)


@contextlib.contextmanager
def mps_server(control: str) -> Iterator[dict[str, str]]:
    """A CUDA MPS control daemon of this process's own, in private pipe and log folders, so that
    only the processes given the environment it yields become its clients and nothing else on
    the machine changes; it is told to quit on the way out. Raises RuntimeError where it does
    not start."""
    # ignore_cleanup_errors: the daemon may still be writing its log as it quits
    with tempfile.TemporaryDirectory(prefix="plugin-mps-", ignore_cleanup_errors=True) as folder:
        env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(folder, "pipe"),
               "CUDA_MPS_LOG_DIRECTORY": os.path.join(folder, "log")}
        for path in env.values():
            os.makedirs(path)
        run_env = {**os.environ, **env}
        try:
            started = subprocess.run([control, "-d"], env=run_env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"the MPS daemon did not start: {err}") from None
        if started.returncode != 0:
            raise RuntimeError(f"the MPS daemon did not start (exit {started.returncode}): "
                               f"{(started.stderr or started.stdout).strip()[:300]}")
        try:
            yield env
        finally:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([control], input="quit\n", env=run_env, capture_output=True, text=True, timeout=60)


def aggregate_rate(found: list[tuple], steps: int, batch_size: int) -> float:
    """Pairs/s of processes that started together (``at_once``'s results): all their pairs over
    the time from the first one's start to the last one's end."""
    return len(found) * steps * batch_size / (max(r[2] for r in found) - min(r[1] for r in found))


def measure_shared(shape: Shape, counts=GPU_COUNTS, steps: int = 100) -> Curve:
    """The curve at ``counts`` processes at once (module docstring)."""
    alone = at_once(shape, 1, steps)[0]
    reference, host_ms, device_ms = alone[3], alone[4], alone[5]
    rates, peaks, equal = {}, [alone[6]], True
    for count in counts:
        found = [alone] if count == 1 else at_once(shape, count, steps)
        rates[str(count)] = aggregate_rate(found, steps, shape.batch_size)
        equal &= all(r[3] == reference for r in found)
        peaks += [r[6] for r in found]
    measured = [p for p in peaks if p is not None]
    return Curve(rates, host_ms, device_ms, max(measured) if measured else None, equal)
