"""The preflight's plan: the work of every notebook at a profile's settings (configurations,
trainings, tokens to decode, caches, fine-tuned models, weights and peak GPU memory), counted
as the notebooks and the grid run it (``harness.preflight`` prints it).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import data
from .. import paper as published
from . import bdpl, models, runner
from .gpus import GpuClass
from .preflight_counts import (TaskCounts, base_shape, cache_bytes, cache_layout, count_task, inference_peak,
                               lora_adapter_params, pretrained_params, reweighter_params, trainable_share,
                               training_peak)
from .profile import Profile
from .variants import PROXY_EXPERTS

TRAINED = ("NewModel", "WeightedComb", "TempNet", "Plugin")
NOTEBOOKS = (
    "00_dataset_statistics", "01_table1_e2e", "02_table2_webnlg", "03_table3_commongen", "04_table4_adidas",
    "05_table5_bdpl_wrapper", "06_fig2_base_quality", "07_fig3_reweighting_complexity", "08_fig7_architecture",
    "09_adidas_case_study", "10_distribution_shift", "11_table8_lora", "12_topk_logprobs",
    "13_theorem1_convergence", "14_api_model", "15_proxy_tuning",
)


def _finetune_cost(plan: "Plan", model: str, profile: Profile, gpu: bool | GpuClass, setup, epochs: int,
                   tokens: float, checkpoints: int) -> None:
    """A fine-tuning of ``model`` (``setup``: a profile ``Finetune``): its work, the disk of its
    ``checkpoints`` (full: float32 weights and AdamW's state; LoRA: the adapters and theirs) and
    its peak GPU memory."""
    if setup.method == "lora":
        adapters = lora_adapter_params(model, setup.lora_rank)
        plan.add(model, lora_tokens=epochs * tokens)
        plan.model_bytes += checkpoints * 12 * adapters
        _peak(plan, training_peak(model, profile, gpu, full=False, adapters=adapters))
        return
    share = trainable_share(model, setup.trainable_layers)
    plan.add(model, finetune_tokens=epochs * tokens)
    plan.model_bytes += checkpoints * int(base_shape(model)["params"] * (4 + 8 * share))
    _peak(plan, training_peak(model, profile, gpu, full=True, trainable_share=share))


@dataclass
class Plan:
    """The work of one notebook; counts are upper bounds where the run may stop earlier."""

    notebook: str
    pairs: int = 0
    target_tokens: int = 0
    configs: int = 0
    seeds: int = 0
    epochs: int = 0
    trainings: int = 0
    decode_tokens: int = 0
    cache_bytes: int = 0
    model_bytes: int = 0  # fine-tuned checkpoints written to disk
    # each trained method's chosen weights (``<label>-best.pt``, float32; TempNet's are smaller)
    weights_bytes: int = 0
    peak_gpu: int = 0
    note: str = ""
    warnings: list[str] = field(default_factory=list)
    # The work the time estimate multiplies by rates, per base model.
    work: list[dict] = field(default_factory=list)

    def add(self, model: str, **work) -> None:
        self.work.append({"model": model, **work})


def grid_size(profile: Profile, method: str) -> int:
    """Configurations searched, at most: a grid of two or more values may grow by
    ``extend_edges`` values past its edge (``runner.select_hparams``). A coordinate search tries
    each hyperparameter's values with the others fixed, sharing the configuration it starts from."""
    sizes = [len(getattr(profile.grid, key)) for key in runner.grid_keys(method)]
    sizes = [n + (profile.grid.extend_edges if n > 1 else 0) for n in sizes]
    if profile.grid.search == "coordinate":
        return sum(sizes) - (len(sizes) - 1)
    return math.prod(sizes)


def _paper_models(table: str, profile: Profile) -> list[str]:
    """The profile's bases that a paper table reports (or twins of them), else all of them."""
    listed = set(published.table(table).model)
    chosen = [m for m in profile.base_models
              if models.model_spec(m).get("paper_model", models.model_spec(m)["display"]) in listed]
    return chosen or list(profile.base_models)


def _trainings(plan: Plan, model: str, counts: TaskCounts, profile: Profile, methods: Sequence[str],
               seeds: int, *, grid: bool = True, scale: float = 1.0) -> None:
    """Grid search with the first seed (unless ``grid`` is False: one configuration), then one
    training per later seed, of each method; ``scale``: cost relative to the family's
    reweighting model. A search's configurations are priced apart (``grid_pair_epochs``): the
    runner trains them together where that pays (``core.train.fit_grid``)."""
    configs = sum(grid_size(profile, m) if grid else 1 for m in methods)
    later = len(methods) * (seeds - 1)
    plan.configs += configs
    plan.trainings += configs + later
    plan.seeds = max(plan.seeds, seeds)
    plan.epochs = profile.training.max_epochs
    plan.weights_bytes += len(methods) * int(4 * reweighter_params(model) * scale)
    epoch_pairs = profile.training.max_epochs * counts.pairs * scale
    plan.add(model, **{"grid_pair_epochs" if grid else "pair_epochs": configs * epoch_pairs})
    plan.add(model, pair_epochs=later * epoch_pairs)


def _decodes(plan: Plan, model: str, counts: TaskCounts, profile: Profile, runs: int, plugin_runs: int = 0) -> None:
    """``runs`` decodings of the test inputs, ``plugin_runs`` of them with a reweighting model."""
    steps = math.ceil(counts.test_inputs / profile.decoding.batch_size) * profile.decoding.max_new_tokens
    plan.decode_tokens += runs * counts.test_inputs * profile.decoding.max_new_tokens
    plan.add(model, decode_steps=(runs - plugin_runs) * steps, plugin_steps=plugin_runs * steps)


def _cache(plan: Plan, model: str, counts: TaskCounts, profile: Profile, gpu: bool, copies: int = 1) -> None:
    """``copies`` new base-output caches of a task (train + hyper) and the base forward passes
    that build them."""
    plan.target_tokens += copies * counts.target_tokens
    plan.cache_bytes += copies * cache_bytes(model, counts.target_tokens, profile, gpu)
    plan.add(model, forward_tokens=copies * counts.pairs * counts.pair_tokens)


def _peak(plan: Plan, value: int) -> None:
    plan.peak_gpu = max(plan.peak_gpu, value)


def plan_notebooks(profile: Profile, gpu: bool) -> list[Plan]:
    """Every notebook's work at ``profile``'s settings (``gpu``: the dtypes of a GPU)."""
    p, seeds = profile, len(profile.seeds)
    count = functools.partial(count_task, profile=p)
    plans = {name: Plan(name) for name in NOTEBOOKS}
    plans["00_dataset_statistics"].note = "CPU, seconds"
    plans["13_theorem1_convergence"].note = "CPU, minutes"
    main_datasets = dict(zip(NOTEBOOKS[1:5], data.DATASETS))
    wrapper = list(p.wrapper.datasets or data.DATASETS)

    for notebook, dataset in main_datasets.items():
        plan = plans[notebook]
        for model in p.base_models:
            c = count(dataset, model)
            plan.pairs = c.pairs
            _cache(plan, model, c, p, gpu)
            _trainings(plan, model, c, p, TRAINED, seeds)
            # Zeroshot once (TempNet-greedy reads its outputs), the other six methods per seed.
            _decodes(plan, model, c, p, runs=1 + 6 * seeds, plugin_runs=2 * seeds)
            _peak(plan, inference_peak(model, p, gpu))

    _plan_bdpl(plans["05_table5_bdpl_wrapper"], p, gpu, wrapper)

    ab = p.ablations
    quality_seeds = len(ab.base_quality_seeds or p.seeds)
    plan = plans["06_fig2_base_quality"]
    c = count("e2e", ab.model)
    tuned = [e for e in ab.finetune_epochs if e > 0]
    pool = _pool_pairs("e2e", p, ab.finetune_pool_pairs, plan)
    plan.pairs = c.pairs
    for _ in tuned:
        _cache(plan, ab.model, c, p, gpu)
        _trainings(plan, ab.model, c, p, ["Plugin"], quality_seeds)
        _decodes(plan, ab.model, c, p, runs=1 + quality_seeds, plugin_runs=quality_seeds)
    if 0 in ab.finetune_epochs and ab.model not in p.base_models:
        _cache(plan, ab.model, c, p, gpu)
        _trainings(plan, ab.model, c, p, ["Plugin"], quality_seeds)
        _decodes(plan, ab.model, c, p, runs=1 + quality_seeds, plugin_runs=quality_seeds)
    if tuned:
        _finetune_cost(plan, ab.model, p, gpu, ab.finetune, max(tuned), pool * c.pair_tokens, len(tuned))
        how = "with LoRA" if ab.finetune.method == "lora" else "in float32"
        plan.note = f"fine-tunes {ab.model} {how}: {max(tuned)} epochs over {pool} pairs"
    _peak(plan, inference_peak(ab.model, p, gpu))

    plan = plans["07_fig3_reweighting_complexity"]
    complexity_seeds = len(ab.complexity_seeds or p.seeds)
    default = models.arch_for(ab.model)
    one = reweighter_params(ab.model)
    plan.pairs = c.pairs
    for layers in ab.layers:
        if layers == default.get("n_layer"):
            continue
        scale = reweighter_params(ab.model, tuple(sorted({**default, "n_layer": layers}.items()))) / one
        _trainings(plan, ab.model, c, p, ["Plugin"], complexity_seeds, grid=ab.complexity_hparams == "own",
                   scale=scale)
        _decodes(plan, ab.model, c, p, runs=complexity_seeds, plugin_runs=complexity_seeds)
    _trainings(plan, ab.model, c, p, ["Plugin"], complexity_seeds, grid=ab.complexity_hparams == "own")
    _decodes(plan, ab.model, c, p, runs=complexity_seeds, plugin_runs=complexity_seeds)
    if ab.model not in p.base_models:
        _cache(plan, ab.model, c, p, gpu)
    _peak(plan, inference_peak(ab.model, p, gpu))
    plan.note = "pretrained variant at the 1-layer rate"

    plan = plans["08_fig7_architecture"]
    architecture_seeds = len(ab.architecture_seeds or p.seeds)
    plan.pairs = c.pairs
    for _ in ("mlp", "linear"):
        _trainings(plan, ab.model, c, p, ["Plugin"], architecture_seeds)
        _decodes(plan, ab.model, c, p, runs=architecture_seeds, plugin_runs=architecture_seeds)
    if ab.model not in p.base_models:
        _cache(plan, ab.model, c, p, gpu)
    _peak(plan, inference_peak(ab.model, p, gpu))
    plan.note = "context-free models at the 1-layer rate (an upper bound)"

    plans["09_adidas_case_study"].note = "reuses notebook 04's runs"
    _peak(plans["09_adidas_case_study"], inference_peak(p.base_models[0], p, gpu))

    plan = plans["10_distribution_shift"]
    model = p.shift.model or ab.model
    shift_setup = p.shift.finetune or ab.finetune
    for dataset in ("webnlg", "commongen"):
        c2 = count(dataset, model)
        pool = _pool_pairs(dataset, p, p.shift.pool_pairs, plan)
        plan.pairs += c2.pairs
        _finetune_cost(plan, model, p, gpu, shift_setup, p.shift.epochs, pool * c2.pair_tokens, 1)
        _cache(plan, model, c2, p, gpu)
        _trainings(plan, model, c2, p, ["Plugin"], seeds)
        _decodes(plan, model, c2, p, runs=1 + seeds, plugin_runs=seeds)
        if model not in p.base_models:
            _decodes(plan, model, c2, p, runs=1)
    how = f"with rank-{shift_setup.lora_rank} LoRA" if shift_setup.method == "lora" else "in float32"
    plan.note = f"fine-tunes {model} {how} ({p.shift.epochs} epochs)"

    _plan_lora(plans["11_table8_lora"], p, gpu, wrapper)

    _plan_topk(plans["12_topk_logprobs"], p, gpu)
    _plan_api(plans["14_api_model"], p, gpu)
    _plan_proxy(plans["15_proxy_tuning"], p, gpu)
    return list(plans.values())


def _plan_topk(plan: Plan, p: Profile, gpu: bool) -> None:
    """Notebook 12: the Plugin on top-k views of the last base (notebook 01's base run reused)."""
    seeds, count = len(p.seeds), functools.partial(count_task, profile=p)
    model = p.base_models[-1]
    c2 = count("e2e", model)
    views = 4  # @topall, @top100, @top20, @top5 (the notebook's defaults); the base is notebook 01's
    plan.pairs = c2.pairs
    shared = cache_layout(model, p, gpu, c2.target_tokens) == "compact" and model in p.base_models
    _cache(plan, model, c2, p, gpu, copies=0 if shared else views)
    for _ in range(views):
        _trainings(plan, model, c2, p, ["Plugin"], seeds)
        _decodes(plan, model, c2, p, runs=1 + seeds, plugin_runs=seeds)
    _peak(plan, inference_peak(model, p, gpu, copies=2))  # the next view loads before the last is freed
    plan.note = (f"{views} top-k views of {model}, reading notebook 01's stored states" if shared else
                 f"{views} top-k views of {model}, a cache each")


def _plan_api(plan: Plan, p: Profile, gpu: bool) -> None:
    """Notebook 14 at its own scale: the in-process view's work is timed like the others; the
    API's is counted in requests (one per target token, one per generated token at most)."""
    api = p.api
    scale = p.replace(rows=api.rows, seeds=api.seeds)
    c2 = count_task("e2e", api.compare, scale)
    methods_run = len(api.methods)
    plan.pairs = c2.pairs
    _cache(plan, api.compare, c2, scale.replace(cache_layout="full"), gpu)  # the API's: log-probabilities only
    _cache(plan, api.compare, c2, scale, gpu)  # the in-process view's
    _trainings(plan, api.compare, c2, scale, [m for m in api.methods if m in TRAINED], len(api.seeds))
    _decodes(plan, api.compare, c2, scale, runs=methods_run, plugin_runs=int("Plugin" in api.methods))
    requests = c2.target_tokens + methods_run * c2.test_inputs * p.decoding.max_new_tokens
    plan.note = (f"plus at most {requests:,} HTTP requests to {api.model} (a llama.cpp server on the CPU: "
                 "0.1-0.7 s each, docs/api.md)")


def _plan_proxy(plan: Plan, p: Profile, gpu: bool) -> None:
    """Notebook 15: beside the main tables' runs (their caches and NewModel's search), the proxy
    arms' expert is trained again for every later seed (once for both) and each arm decodes."""
    seeds, count = len(p.seeds), functools.partial(count_task, profile=p)
    for dataset in data.DATASETS:
        for model in p.base_models:
            c2 = count(dataset, model)
            plan.pairs = max(plan.pairs, c2.pairs)
            runs = seeds - 1  # the first seed's expert is NewModel's stored one
            plan.trainings += runs
            plan.seeds, plan.epochs = seeds, p.training.max_epochs
            plan.add(model, pair_epochs=runs * p.training.max_epochs * c2.pairs)
            _decodes(plan, model, c2, p, runs=2 * seeds, plugin_runs=2 * seeds)
            if p.proxy.pretrained:
                _plan_pretrained_arms(plan, model, c2, p)
        _peak(plan, inference_peak(model, p, gpu))
    plan.note = "2 proxy arms over notebooks 01-04's NewModel; alpha chosen on cached hyper-validation outputs"
    if p.proxy.pretrained:
        plan.note += "; with a pretrained expert, its anti-expert and the Plugin from it (at their parameter count)"


def _plan_pretrained_arms(plan: Plan, model: str, counts: TaskCounts, p: Profile) -> None:
    """Notebook 15's ``-pretrained`` arms on one task: NewModel-pretrained (the expert) and
    Plugin-pretrained trained (a search each, or one configuration with the 1-layer choice), the
    expert again per later seed for the two proxy arms, and four decodings per seed, the proxy
    arms' with two small models; trainings priced at the pretrained model's parameter count."""
    setup = p.ablations
    if model not in PROXY_EXPERTS and setup.pretrained_layers is None:
        plan.warnings.append(f"{plan.notebook}: no pretrained expert is known for {model}: set "
                             "ablations.pretrained_layers or proxy.pretrained: false.")
        return
    source = PROXY_EXPERTS.get(model, model)  # else the base itself, cut to pretrained_layers blocks
    scale = pretrained_params(model, source, setup.pretrained_layers) / reweighter_params(model)
    _trainings(plan, model, counts, p, ["NewModel", "Plugin"], len(p.seeds),
               grid=setup.complexity_hparams == "own", scale=scale)
    runs = len(p.seeds) - 1
    plan.trainings += runs
    plan.add(model, pair_epochs=runs * p.training.max_epochs * counts.pairs * scale)
    _decodes(plan, model, counts, p, runs=4 * len(p.seeds), plugin_runs=3 * len(p.seeds))


def _plan_bdpl(plan: Plan, p: Profile, gpu: bool, wrapper: list[str]) -> None:
    """Notebook 05: BDPL's searches, then the Plugin on each seed's prefixed task."""
    seeds, count = len(p.seeds), functools.partial(count_task, profile=p)
    # BDPL's training calls (a minibatch each), then its final choice: the argmax prompt after
    # each update and the empty prompt, each over every hyper-validation pair.
    budget, bdpl_settings = p.wrapper.bdpl_budget, p.wrapper.bdpl
    updates = sum(size > 1 for size in bdpl.step_sizes(budget, bdpl_settings.samples_per_step))
    for model in _paper_models("table5", p):
        for dataset in wrapper:
            c = count(dataset, model)
            plan.pairs += c.pairs
            calls_tokens = budget * bdpl_settings.batch_size + (updates + 1) * c.hyper_pairs
            plan.add(model, forward_tokens=seeds * calls_tokens * c.pair_tokens)
            _cache(plan, model, c, p, gpu, copies=seeds)  # a prefixed task per seed
            _trainings(plan, model, c, p, ["Plugin"], seeds)
            _decodes(plan, model, c, p, runs=2 * seeds, plugin_runs=seeds)
            _peak(plan, inference_peak(model, p, gpu))
    plan.note = f"BDPL: {p.wrapper.bdpl_budget} calls per seed"


def _plan_lora(plan: Plan, p: Profile, gpu: bool, wrapper: list[str]) -> None:
    """Notebook 11: LoRA's grid and seeds, through a second copy of the base."""
    seeds, count = len(p.seeds), functools.partial(count_task, profile=p)
    for model in _paper_models("table8", p):
        for dataset in wrapper:
            c2 = count(dataset, model)
            plan.pairs += c2.pairs
            configs = grid_size(p, "LoRA")
            runs = configs + seeds - 1
            plan.configs += configs
            plan.trainings += runs
            plan.seeds, plan.epochs = seeds, p.training.max_epochs
            plan.add(model, lora_tokens=runs * p.training.max_epochs * c2.pairs * c2.pair_tokens)
            _decodes(plan, model, c2, p, runs=seeds)
        _peak(plan, training_peak(model, p, gpu, full=False) + inference_peak(model, p, gpu))
    plan.note = "LoRA trains through a second copy of the base"


def _pool_pairs(dataset: str, profile: Profile, max_pairs: int | None, plan: Plan) -> int:
    """Pairs of the fine-tuning pool (``harness.finetune.finetune_pool``). Where the data has
    none to offer (E2E offline, whose train split is not in the data folder, with the whole
    validation split in use), the paper's train-split size is counted and a warning says so."""
    from .finetune import finetune_pool

    try:
        return len(data.training_pairs(finetune_pool(dataset, profile, max_pairs).examples))
    except (ValueError, data.MissingDataError) as err:
        counts = published.table("table7_counts").set_index(["dataset", "split"])["rows"]
        pairs = int(counts.get((dataset, "train"), 0) or 0)
        pairs = min(pairs, max_pairs) if max_pairs is not None else pairs
        plan.warnings.append(f"{plan.notebook}: no fine-tuning pool for {dataset} in this data folder ({err}) "
                             f"The run needs {dataset}'s train split (the Hub provides it); counted here: the "
                             f"paper's {pairs:,} pairs.")
        return pairs
