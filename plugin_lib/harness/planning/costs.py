"""The one cost model: what a unit of the grid (``harness.grid.units``) costs.

Every estimate prices units: ``plugin-repro grid plan`` per unit, the preflight per notebook
(each unit counted once, under the first notebook that lists it). A unit's cost is

- its work (:func:`work`): forward tokens of the base, pair-epochs of reweighting-model
  training (a search's configurations apart, ``grid_pair_epochs``), decoding steps with or
  without a reweighting model, LoRA and fine-tuning tokens; ``preflight_rates.Rates.seconds``
  turns it into seconds;
- its peak GPU memory (:func:`gpu_bytes`) and the disk it writes (:func:`disk_bytes`).

Training is counted at every epoch (an upper bound: training stops early) unless ``epochs``
says how many a training runs, and at the unit's reweighting model's parameter count relative
to the family's (a pretrained or deeper model costs more per pair, :func:`model_scale`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import methods, models
from ..running import run_keys
from ..running.output_layers import trains_from_cache
from .gpus import GpuClass
from .preflight_counts import (EXPERT_CONFIGS, TaskCounts, base_shape, cache_bytes, cache_layout, cache_training_peak,
                               count_task, finetune_setup, inference_peak, lora_adapter_params, pretrained_params,
                               reweighter_params, trainable_share, training_peak)

if TYPE_CHECKING:  # the units import the runner's machinery; the cost model reads their fields only
    from ..grid.units import Unit

# Methods whose decoding runs a reweighting model beside the base (the Plugin's step cost).
REWEIGHTED = ("NewModel", "WeightedComb", "Plugin", *methods.PROXY_ARMS)
TRAINED = methods.TRAINED_METHODS + methods.EXTRA_METHODS


def shape_of(unit: Unit) -> str:
    """The registry model whose shape and rates stand for the unit's base: a top-k view's base,
    a fine-tuned base's original."""
    if unit.task.checkpoint:
        return unit.task.prompt_model
    view = models.parse_model_name(unit.model)
    return view[0] if view is not None else unit.model


def reads_base_states(unit: Unit, gpu: bool | GpuClass) -> bool:
    """A top-k view's cache unit whose base's cache is compact: the view reads the base's stored
    final hidden states (``BlackBoxLM.states_name``), so it costs nothing of its own."""
    if unit.kind != "cache" or unit.task.checkpoint or models.parse_model_name(unit.model) is None:
        return False
    model = shape_of(unit)
    return cache_layout(model, unit.profile, gpu, counts_of(unit).target_tokens) == "compact"


def counts_of(unit: Unit) -> TaskCounts:
    return count_task(unit.task.dataset, shape_of(unit), unit.profile)


def model_scale(unit: Unit) -> float:
    """The unit's reweighting model's parameters over the family's: the cost of a pair-epoch
    relative to the family's model (a pretrained expert's, a deeper or context-free model's)."""
    model, arch = shape_of(unit), dict(unit.arch)
    if not arch or arch.get("arch") in ("mlp", "linear"):  # context-free: at most the 1-layer model's cost
        return 1.0
    if arch.get("arch") == "pretrained":
        source = arch["pretrained"]  # a known expert, else the base cut to pretrained_layers blocks
        params = pretrained_params(model, source if source in EXPERT_CONFIGS else model,
                                   unit.profile.ablations.pretrained_layers)
    else:
        params = reweighter_params(model, unit.arch)
    return params / reweighter_params(model)


def _proxy_expert_trained(unit: Unit) -> bool:
    """A later seed's proxy arm trains the expert, once for both arms (``runner._expert``):
    counted on the first arm."""
    return unit.method == methods.PROXY_ARMS[0] and unit.seed != unit.profile.seeds[0]


def work(unit: Unit, gpu: bool | GpuClass, counts: TaskCounts | None = None, *, epochs: float | None = None,
         configs: float | None = None, under_way: int = 0) -> dict:
    """The unit's work: at most (every training runs all its epochs, every search tries every
    configuration), or at ``epochs`` per training and ``configs`` per search. A fine-tuned
    base's or BDPL's work is its notebook's estimate (``Unit.work``), its trainings scaled to
    ``epochs``. A coordinate search with ``under_way`` configurations stored has the rest left,
    one configuration at least."""
    profile = unit.profile
    counts = counts or counts_of(unit)
    cap = profile.training.max_epochs
    epochs = cap if epochs is None else epochs
    if unit.kind in ("finetune", "bdpl"):
        share = epochs / cap
        found = {k: v * share if k in ("pair_epochs", "lora_tokens") else v for k, v in unit.work}
        if unit.kind == "finetune" and finetune_setup(shape_of(unit), profile).method == "lora":
            found["lora_tokens"] = found.pop("finetune_tokens", 0.0) * share
        return found
    if unit.kind == "cache":
        return {} if reads_base_states(unit, gpu) else {"forward_tokens": counts.pairs * counts.pair_tokens}
    pair_epochs = epochs * counts.pairs * model_scale(unit)  # of one training

    def train(times: float, search: bool) -> dict:
        if unit.method == "LoRA":
            return {"lora_tokens": times * epochs * counts.pairs * counts.pair_tokens}
        return {"grid_pair_epochs" if search else "pair_epochs": times * pair_epochs}

    if unit.kind == "config":
        return train(1, search=True)
    if unit.kind == "selection":  # the configurations it may try beyond the grid's config units
        most = grid_size(profile, unit.method)
        tried = min(most, configs) if configs is not None else most
        if profile.grid.search == "grid":
            return train(max(0.0, tried - len(run_keys.hparam_grid(profile, unit.method))), search=True)
        return train(max(1.0, tried - under_way) if under_way else tried, search=False)
    found: dict = {}
    # A trained method trains on later seeds, and on the first too when narrowed (a grid of the
    # Plugin's one configuration, inside its run); a proxy arm reads its expert's weights.
    if (unit.method in TRAINED and (unit.seed != profile.seeds[0] or unit.narrow)) or _proxy_expert_trained(unit):
        found.update(train(1, search=False))
    if unit.method != "TempNet-greedy":  # it reads Zeroshot's outputs
        found["plugin_steps" if unit.method in REWEIGHTED else "decode_steps"] = decode_steps(unit, counts)
    return found


def decode_steps(unit: Unit, counts: TaskCounts) -> int:
    profile = unit.profile
    return math.ceil(counts.test_inputs / profile.decoding.batch_size) * profile.decoding.max_new_tokens


def grid_size(profile, method: str) -> int:
    """Configurations a search tries, at most: a grid of two or more values may grow by
    ``extend_edges`` values past its edge (``search.select_hparams``). A coordinate search tries
    each hyperparameter's values with the others fixed, sharing the configuration it starts from."""
    sizes = [len(getattr(profile.grid, key)) for key in run_keys.grid_keys(method)]
    sizes = [n + (profile.grid.extend_edges if n > 1 else 0) for n in sizes]
    if profile.grid.search == "coordinate":
        return sum(sizes) - (len(sizes) - 1)
    return math.prod(sizes)


@dataclass(frozen=True)
class Tally:
    """What a unit adds to its notebook's row: configurations searched and trainings (upper
    bounds), tokens decoded, and bytes written (caches, fine-tuned checkpoints, chosen weights)."""

    configs: int = 0
    trainings: int = 0
    decode_tokens: int = 0
    cache_bytes: int = 0
    model_bytes: int = 0  # fine-tuned checkpoints
    weights_bytes: int = 0  # each trained method's chosen weights (``<label>-best.pt``, float32)
    target_tokens: int = 0

    def __add__(self, other: Tally) -> Tally:
        """Both tallies summed: a notebook's row is the sum of its units'."""
        return Tally(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(Tally)})

    @property
    def disk_bytes(self) -> int:
        """What it writes to disk: caches, fine-tuned checkpoints and chosen weights."""
        return self.cache_bytes + self.model_bytes + self.weights_bytes


def tally(unit: Unit, gpu: bool | GpuClass, counts: TaskCounts | None = None) -> Tally:
    profile = unit.profile
    counts = counts or counts_of(unit)
    model = shape_of(unit)
    if unit.kind == "cache":
        if reads_base_states(unit, gpu):
            return Tally()
        return Tally(cache_bytes=cache_bytes(model, counts.target_tokens, profile, gpu),
                     target_tokens=counts.target_tokens)
    if unit.kind == "finetune":
        return Tally(model_bytes=checkpoint_bytes(model, profile))
    if unit.kind == "bdpl":  # from its work: a prefixed task per seed, its cache, trainings, two decodings
        found, steps = dict(unit.work), decode_steps(unit, counts)
        seeds = round(found.get("decode_steps", 0) / steps)
        trainings = round(found.get("pair_epochs", 0) / (profile.training.max_epochs * counts.pairs))
        searched = trainings > seeds  # the Plugin's search on the first seed's prompt: its chosen weights
        return Tally(configs=trainings if searched else 0, trainings=trainings,
                     weights_bytes=int(4 * reweighter_params(model)) if searched else 0,
                     decode_tokens=2 * seeds * counts.test_inputs * profile.decoding.max_new_tokens,
                     cache_bytes=seeds * cache_bytes(model, counts.target_tokens, profile, gpu),
                     target_tokens=seeds * counts.target_tokens)
    if unit.kind == "config":
        return Tally(configs=1, trainings=1)
    if unit.kind == "selection":
        beyond = grid_size(profile, unit.method) - (len(run_keys.hparam_grid(profile, unit.method))
                                                      if profile.grid.search == "grid" else 0)
        weights = 0 if unit.method == "LoRA" else int(4 * reweighter_params(model) * model_scale(unit))
        return Tally(configs=beyond, trainings=beyond, weights_bytes=weights)
    trained = bool(work(unit, gpu, counts).keys() & {"pair_epochs", "lora_tokens"})
    decoded = 0 if unit.method == "TempNet-greedy" else counts.test_inputs * profile.decoding.max_new_tokens
    # A narrowed run searches a grid of one configuration inside its run, keeping its chosen weights.
    chosen = unit.narrow and unit.method in TRAINED and unit.seed == profile.seeds[0]
    return Tally(trainings=int(trained), decode_tokens=decoded,
                 weights_bytes=int(4 * reweighter_params(model) * model_scale(unit)) if chosen else 0)


def checkpoint_bytes(model: str, profile) -> int:
    """A fine-tuned base on disk: float32 weights and AdamW's state of its trained share, or the
    LoRA adapters and theirs."""
    setup = finetune_setup(model, profile)
    if setup.method == "lora":
        return 12 * lora_adapter_params(model, setup.lora_rank)
    share = trainable_share(model, setup.trainable_layers)
    return int(base_shape(model)["params"] * (4 + 8 * share))


def gpu_bytes(unit: Unit, gpu: bool | GpuClass) -> int:
    """The unit's peak GPU memory: the base at inference (LoRA's trainings through a second
    copy), or the profile's fine-tuning recipe."""
    model, profile = shape_of(unit), unit.profile
    if unit.kind == "finetune":
        setup = finetune_setup(model, profile)
        if setup.method == "lora":
            return training_peak(model, profile, gpu, full=False,
                                 adapters=lora_adapter_params(model, setup.lora_rank))
        return training_peak(model, profile, gpu, full=True,
                             trainable_share=trainable_share(model, setup.trainable_layers))
    peak = inference_peak(model, profile, gpu)
    if unit.method == "LoRA" and unit.kind in ("config", "selection", "run"):
        peak += training_peak(model, profile, gpu, full=False)
    return peak


def base_peaks(units, gpu: bool | GpuClass) -> dict[str, tuple[int, int]]:
    """Per base (``shape_of``): the largest peak GPU memory of a unit that holds the whole base,
    and of a process that trains from the caches with the output layer alone (0 without one):
    what decides how many trainings share a GPU (``harness.planning.concurrency``)."""
    return merge_peaks(*({shape_of(unit): (0, training_process_bytes(unit, gpu)) if trains_from_cache(unit)
                          else (gpu_bytes(unit, gpu), 0)} for unit in units))


def merge_peaks(*found: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Per base, the largest of each peak in ``found`` (``base_peaks``' values)."""
    peaks: dict[str, tuple[int, int]] = {}
    for each in found:
        for model, (heavy, light) in each.items():
            seen = peaks.get(model, (0, 0))
            peaks[model] = (max(seen[0], heavy), max(seen[1], light))
    return peaks


def training_process_bytes(unit: Unit, gpu: bool | GpuClass) -> int:
    """The peak GPU memory of a process that computes a unit training from the caches with the
    base's output layer alone (``units.trains_from_cache``, ``executors.run_local(trainings=N)``):
    the task's cache beside the layer and the unit's reweighting model."""
    model = shape_of(unit)
    params = int(reweighter_params(model) * model_scale(unit))
    return cache_training_peak(model, unit.profile, gpu, counts_of(unit).target_tokens, params)
