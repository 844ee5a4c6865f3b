"""How many trainings share one GPU, and the rate the plan prices them at.

The units that train from the stored caches (``grid.units.trains_from_cache``) run ``n`` at once,
each in a process of its own holding the base's output layer alone, beside the one process that
holds the whole base (``grid.executors``). A reweighting model's step leaves an H200 idle about
90% of the time (the host dispatches each operation), so ``n`` processes keep it busier, and
each computes what it would compute alone: the results are the same bit for bit.

``n`` is the profile's ``trainings_at_once``, or with ``auto``:

- on a CPU, 1: there a training's arithmetic, not its dispatching, sets the pace;
- on a GPU, the least of: the processes that fit in the GPU's memory (less its headroom) beside
  the largest unit that needs the whole base, each at its measured peak where a rates file has
  one (else ``preflight_counts.cache_training_peak``'s estimate); the cores less one (each
  process dispatches its own kernels); and the count at which the measured concurrency curve
  (``Rates.shared_train_pairs_per_s``) is fastest, or ``AUTO_CAP`` until one is measured.

The plan prices a search's configurations at the curve's aggregate rate at ``n``
(``Rates.for_profile``) where one is measured, and one at a time otherwise, saying which
(:func:`basis`).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ...core.cache import gpu_headroom
from ..profile import Profile

GIB = 2**30
AUTO_CAP = 12  # the most processes auto starts before a curve is measured (the GPU script measures 1, 4, 8, 12)


@dataclass(frozen=True)
class Sharing:
    """``trainings`` units that train from the caches at once, and why that many."""

    trainings: int
    why: str


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def best_measured(curve: Mapping[str, float] | None, at_most: int) -> int | None:
    """The count of the curve (aggregate pairs/s at k processes) with the highest rate among
    those at most ``at_most``; None without a measured count there."""
    counts = sorted(int(k) for k in (curve or {}) if int(k) <= at_most)
    return max(counts, key=lambda k: (curve[str(k)], -k)) if counts else None


def choose(setting: str | int, *, gpu_bytes: int | None, heavy_peak: int, process_peak: int, cores: int,
           curve: Mapping[str, float] | None = None, measured_peak: bool = False) -> Sharing:
    """How many trainings at once (module docstring): ``setting`` the profile's
    ``trainings_at_once``; ``gpu_bytes`` the GPU memory the run may use (None: a CPU);
    ``heavy_peak`` the largest peak of a unit that holds the whole base; ``process_peak`` a
    training process's peak (``measured_peak``: measured, else estimated); ``curve`` the measured
    aggregate rates by count."""
    if setting != "auto":
        return Sharing(int(setting), f"{setting} at once, as set (trainings_at_once)")
    if gpu_bytes is None:
        return Sharing(1, "one at a time on a CPU, where a training's arithmetic sets the pace "
                          "(trainings_at_once: a count shares the cores)")
    room = gpu_bytes - gpu_headroom(gpu_bytes) - heavy_peak
    fits = max(1, room // max(process_peak, 1))
    by_cores = max(1, cores - 1)
    peak = "measured" if measured_peak else "estimated"
    limits = (f"{fits} fit in {gpu_bytes / GIB:,.0f} GiB beside a unit with the whole base ({heavy_peak / GIB:,.1f} "
              f"GiB) at {process_peak / GIB:,.1f} GiB each ({peak}); {cores} cores, one for that unit")
    best = best_measured(curve, min(fits, by_cores))
    if best is not None:
        return Sharing(best, f"{best} at once: {limits}; the measured curve is fastest there")
    n = int(min(fits, by_cores, AUTO_CAP))
    return Sharing(n, f"{n} at once: {limits}; at most {AUTO_CAP} until a concurrency curve is measured")


def basis(rates, sharing: Sharing) -> str:
    """How the plan prices a search's configurations for ``rates`` (``preflight_rates.Rates``)."""
    curve = rates.shared_train_pairs_per_s
    k = best_measured(curve, sharing.trainings) if sharing.trainings > 1 else None
    if k:
        return (f"a search's configurations priced {k} at once at {curve[str(k)]:,.0f} pairs/s together "
                f"(x{curve[str(k)] / rates.train_pairs_per_s:.2f} one alone; measured with {rates.measured_with}); "
                f"{sharing.why}")
    reason = "no concurrency curve measured" if not curve else f"{sharing.why}"
    return f"trainings priced one process at a time ({reason})"


def for_profile(profile: Profile, *, gpu_bytes: int | None, heavy_peak: int, process_peak: int,
                rates=None) -> Sharing:
    """:func:`choose` for ``profile`` with a rates file's measured curve, peak and cores where it has them."""
    measured = getattr(rates, "training_process_bytes", None)
    return choose(profile.trainings_at_once, gpu_bytes=gpu_bytes, heavy_peak=heavy_peak,
                  process_peak=measured or process_peak, measured_peak=bool(measured),
                  cores=getattr(rates, "cores", None) or machine_cores(),
                  curve=getattr(rates, "shared_train_pairs_per_s", None))


def planning_gpu_bytes(rates, card=None, profile: Profile | None = None) -> int | None:
    """The GPU memory a plan shares out: the named GPU class's, else what the rates were measured
    on, else this machine's GPU, else for a GPU profile one 80 GB GPU (what it is planned for);
    None on a CPU."""
    import torch

    from .. import profile as config

    if card is not None:
        return int(card.memory_gib * GIB)
    if getattr(rates, "gpu_memory_bytes", None):
        return rates.gpu_memory_bytes
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return 80 * GIB if profile is not None and profile.name in config.GPU_PROFILES else None


def priced(model: str, rates, profile: Profile, peaks: tuple[int, int], gpu_bytes: int | None):
    """(``rates`` as ``profile`` runs ``model``'s units, the sharing they assume): a search's
    configurations at the concurrency curve where the run shares the GPU (``Rates.for_profile``),
    LoRA with its activations recomputed where its planned peak needs it. The preflight and
    ``grid plan`` both price with it."""
    from .preflight_counts import lora_recompute

    heavy, light = peaks
    sharing = for_profile(profile, gpu_bytes=gpu_bytes, heavy_peak=heavy, process_peak=light, rates=rates) \
        if light else Sharing(1, "no unit trains from the caches")
    recompute = rates.device == "cuda" and (gpu_bytes is None or lora_recompute(model, profile, gpu_bytes))
    return rates.for_profile(profile, sharing.trainings, lora_recompute=recompute), sharing


def for_run(profile: Profile, units, *, rates: Mapping | None = None) -> Sharing:
    """How many trainings ``grid run`` shares the GPU among for ``units`` (the profile's
    ``trainings_at_once``): on a GPU from its free memory now, the
    units' peaks (``costs.base_peaks``; a rates file's measured peak and curve where given), and
    the cores; the fewest any base allows. 1 on a CPU unless set."""
    import torch

    from ...core.cache import gpu_free_bytes
    from . import costs

    cuda = torch.cuda.is_available()
    peaks = {m: p for m, p in costs.base_peaks(units, cuda).items() if p[1]}
    if not peaks:
        return Sharing(1, "no unit trains from the caches")
    gpu_bytes = gpu_free_bytes(torch.device("cuda"))[0] if cuda else None  # measured now
    choices = [for_profile(profile, gpu_bytes=gpu_bytes, heavy_peak=heavy, process_peak=light,
                           rates=(rates or {}).get(model)) for model, (heavy, light) in peaks.items()]
    return min(choices, key=lambda s: s.trainings)
