"""The plan of a whole run before it starts: work, memory, disk and time per notebook.

``python -m plugin_lib.harness.preflight --profile NAME`` prints, for every notebook:

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
the caches and fine-tuned models exceed the free disk. ``--plan-only`` prints the plan and
checks nothing (e.g. to read a GPU profile's plan on a laptop). Counting needs the data (``PLUGIN_DATA_DIR``) and a tokenizer: the base's own where it is
available offline, otherwise SmolLM2's stands in (the counts are then approximate; GPT-2's
and LLaMA-3's tokenizers give counts within about 15% of it on this English text).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .. import data
from .. import paper as published
from ..core.decode import PluginLogitsProcessor
from ..core.reweighter import count_parameters, make_reweighter
from ..core.train import (BaseOutputCache, EncodedPair, TokenObjective, cache_dtype, choose_layout,
                          choose_placement, host_available_bytes)
from ..data import prompts
from . import bdpl, gpus, models, runner
from . import profile as config
from .gpus import GpuClass
from .profile import Profile

GIB = 2**30
GPU_PROFILES = ("paper", "colab")  # profiles meant for a GPU; the others are planned on any machine
PROBED_H100 = gpus.PROBED_H100
TRAINED = ("NewModel", "WeightedComb", "TempNet", "Plugin")
NOTEBOOKS = (
    "00_dataset_statistics", "01_table1_e2e", "02_table2_webnlg", "03_table3_commongen", "04_table4_adidas",
    "05_table5_bdpl_wrapper", "06_fig2_base_quality", "07_fig3_reweighting_complexity", "08_fig7_architecture",
    "09_adidas_case_study", "10_distribution_shift", "11_table8_lora", "12_topk_logprobs",
    "13_theorem1_convergence", "14_api_model",
)


# ---------------------------------------------------------------- counting


@dataclass(frozen=True)
class TaskCounts:
    """One (dataset, prompt family) at the profile's scale, counted with one tokenizer."""

    train_pairs: int
    hyper_pairs: int
    target_tokens: int  # train + hyper, EOS included: the rows of the base-output caches
    pair_tokens: float  # mean prompt + target tokens of a training pair
    test_inputs: int
    prompt_tokens: float  # mean test-prompt tokens

    @property
    def pairs(self) -> int:
        return self.train_pairs + self.hyper_pairs


@functools.lru_cache(maxsize=None)
def tokenizer_for(model: str):
    """(tokenizer, exact?): the model's own where it loads offline, else SmolLM2's."""
    spec = models.model_spec(model)
    if spec["source"] == "hub":
        try:
            return AutoTokenizer.from_pretrained(spec["hub_id"]), True
        except Exception:  # not in the local Hub cache, or no Hub: the stand-in counts
            return _smollm2_tokenizer(), False
    return _smollm2_tokenizer(), True  # the twins use it; SmolLM2's own is the same


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    return models.twin_tokenizer()


@functools.lru_cache(maxsize=None)
def _splits(dataset: str, rows: config.Rows) -> tuple[list, list, list]:
    validation = data.load_dataset(dataset, "validation", rows=rows.validation)
    train, hyper = data.split_hyper_validation(validation, frac=0.4, seed=0)
    return train, hyper, data.load_dataset(dataset, "test", rows=rows.test)


_LENGTHS: dict[tuple[int, bool], dict[str, int]] = {}


def _token_lengths(tokenizer, texts: Sequence[str], special: bool) -> list[int]:
    """Token counts of ``texts``, each distinct text tokenised once per tokenizer (pairs share
    prompts: a dataset has several references per input, and its models share references)."""
    known = _LENGTHS.setdefault((id(tokenizer), special), {})
    new = list(dict.fromkeys(t for t in texts if t not in known))
    if new:
        ids = tokenizer(new, add_special_tokens=special, return_attention_mask=False)["input_ids"]
        known.update(zip(new, map(len, ids)))
    return [known[t] for t in texts]


def count_task(dataset: str, model: str, profile: Profile) -> TaskCounts:
    """Pairs and tokens of ``dataset`` as the runner encodes them for ``model``
    (``core.train.encode_pairs``: the prompt's last ``max_prompt`` tokens, the target's first
    ``max_target`` and EOS)."""
    spec = models.model_spec(model)
    tokenizer, _ = tokenizer_for(model)
    return _count(dataset, spec["family"], bool(spec.get("chat_template", False)), profile.prompts, id(tokenizer),
                  profile.rows, profile.tokens, tokenizer)


@functools.lru_cache(maxsize=None)
def _count(dataset: str, family: str, chat: bool, style: str, _tokenizer_id: int, rows: config.Rows,
           tokens: config.Tokens, tokenizer) -> TaskCounts:
    train, hyper, test = _splits(dataset, rows)

    def prompt(ex):
        return prompts.format_for_model(prompts.build_prompt(dataset, family, ex.source, style=style), tokenizer, chat)

    pairs = data.training_pairs(train) + data.training_pairs(hyper)
    prompt_lengths = [min(n, tokens.max_prompt) for n in _token_lengths(tokenizer, [prompt(ex) for ex, _ in pairs], True)]
    target_lengths = [min(n, tokens.max_target) + 1 for n in _token_lengths(tokenizer, [r for _, r in pairs], False)]
    test_lengths = [min(n, tokens.max_prompt) for n in _token_lengths(tokenizer, [prompt(ex) for ex in test], True)]
    return TaskCounts(
        train_pairs=len(data.training_pairs(train)), hyper_pairs=len(data.training_pairs(hyper)),
        target_tokens=sum(target_lengths),
        pair_tokens=float(np.mean(prompt_lengths) + np.mean(target_lengths)) if pairs else 0.0,
        test_inputs=len(test), prompt_tokens=float(np.mean(test_lengths)) if test_lengths else 0.0,
    )


# ---------------------------------------------------------------- shapes and memory


@functools.lru_cache(maxsize=None)
def shape_model(model: str) -> str:
    """The model whose configuration stands for ``model``'s shape: its full-size twin
    (``twin`` in the registry) for a Hub model, otherwise the model itself."""
    spec = models.model_spec(model)
    return spec.get("twin", model)


@functools.lru_cache(maxsize=None)
def _shape(model: str) -> dict:
    """Parameters, vocabulary, layers, KV width and hidden sizes of a base, without weights."""
    cfg = models.model_config(shape_model(model))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return {
        "params": sum(p.numel() for p in meta.parameters()),
        "vocab": meta.get_output_embeddings().weight.shape[0],
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "intermediate": getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size,
        "kv_width": kv_heads * head_dim,
    }


@functools.lru_cache(maxsize=None)
def reweighter_params(model: str, arch_items: tuple = ()) -> int:
    arch = dict(arch_items) or models.arch_for(model)
    with torch.device("meta"):
        return count_parameters(make_reweighter(vocab_size=_shape(model)["vocab"], **arch))


def load_dtype(model: str, profile: Profile, gpu: bool | GpuClass) -> torch.dtype:
    """The dtype ``model`` loads in; ``gpu``: True for this machine's GPU, or a named GPU class."""
    bf16 = gpu.bf16 if isinstance(gpu, GpuClass) else _bf16()
    return models.resolve_dtype(model, profile.dtype, "cuda" if gpu else "cpu", bf16_supported=bf16)


def _bf16() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()) or not torch.cuda.is_available()


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def cache_layout(model: str, profile: Profile, gpu: bool | GpuClass, target_tokens: int = 0) -> str:
    """The layout ``BaseOutputCache.build`` will choose for ``model``'s cache (``core.cache``):
    the profile's, or by ``choose_layout`` (compact on a GPU; on a CPU full where it fits memory)."""
    if profile.cache_layout != "auto" and models.model_spec(model)["source"] != "api":
        return profile.cache_layout
    full = target_tokens * _shape(model)["vocab"] * _bytes(cache_dtype(load_dtype(model, profile, gpu)))
    return choose_layout(full, device_type="cuda" if gpu else "cpu", compact=models.model_spec(model)["source"] != "api",
                         host_available=host_available_bytes())[0]


def cache_bytes(model: str, target_tokens: int, profile: Profile, gpu: bool | GpuClass) -> int:
    """Bytes of ``model``'s cache of ``target_tokens`` in the layout it will have: V
    log-probabilities a token (full), or d hidden values in the model's dtype (compact)."""
    if cache_layout(model, profile, gpu, target_tokens) == "compact":
        return target_tokens * _shape(model)["hidden"] * _bytes(load_dtype(model, profile, gpu))
    return target_tokens * _shape(model)["vocab"] * _bytes(cache_dtype(load_dtype(model, profile, gpu)))


def inference_peak(model: str, profile: Profile, gpu: bool, copies: int = 1) -> int:
    """Bytes on the GPU while a base builds its cache, decodes, or a reweighting model trains
    beside it: weights, the largest transient (logits of a cache batch in float32, or the KV
    cache of a decoding batch), a reweighting model with AdamW, and 1 GiB of CUDA context."""
    s, b = _shape(model), _bytes(load_dtype(model, profile, gpu))
    seq = profile.tokens.max_prompt + profile.tokens.max_target + 1
    cache_batch = profile.training.batch_size * seq * s["vocab"] * (b + 4)
    decode_seq = profile.tokens.max_prompt + profile.decoding.max_new_tokens
    kv = 2 * s["layers"] * s["kv_width"] * profile.decoding.batch_size * decode_seq * b
    decode = kv + profile.decoding.batch_size * s["vocab"] * 4 * 3
    reweighter = 16 * reweighter_params(model)
    return copies * s["params"] * b + max(cache_batch, decode) + reweighter + GIB


def training_peak(model: str, profile: Profile, gpu: bool | GpuClass, *, full: bool, trainable_share: float = 1.0,
                  adapters: int = 0) -> int:
    """Bytes on the GPU for training through the base: full fine-tuning in float32 (weights,
    gradients, AdamW's two moments: 16 bytes per trained parameter) or LoRA on the loaded base
    (``adapters`` float32 parameters with their gradients and moments: 16 bytes each); plus
    activations kept for the backward pass (about 10 hidden-size and 3 intermediate-size
    tensors per layer and token; LoRA on a GPU recomputes them, ``lora.checkpoint_activations``,
    keeping each block's input and one block's activations) and the float32 logits, their
    log-softmax and its gradient."""
    s = _shape(model)
    b = 4 if full else _bytes(load_dtype(model, profile, gpu))
    tokens = profile.training.batch_size * (profile.tokens.max_prompt + profile.tokens.max_target + 1)
    block = tokens * (10 * s["hidden"] + 3 * s["intermediate"]) * b
    activations = block * s["layers"] if full else tokens * s["layers"] * s["hidden"] * b + block
    logits = tokens * s["vocab"] * 4 * 3
    weights = s["params"] * (4 + 12 * trainable_share) if full else s["params"] * b + 16 * adapters
    return int(weights + activations + logits + GIB)


def lora_adapter_params(model: str, rank: int) -> int:
    """Parameters of rank-``rank`` adapters on every linear layer of ``model``'s blocks
    (``finetune.LORA_LAYERS``): r * (fan in + fan out) per layer."""
    s = _shape(model)
    kv, h, i = s["kv_width"], s["hidden"], s["intermediate"]
    if models.model_config(shape_model(model)).model_type == "gpt2":
        per_block = (h + 3 * h) + (h + h) + (h + i) + (i + h)  # c_attn, attention c_proj, c_fc, MLP c_proj
    else:
        per_block = 2 * (h + h) + 2 * (h + kv) + 3 * (h + i)  # q, o; k, v; gate, up, down
    return rank * per_block * s["layers"]


def finetune_peak(model: str, profile: Profile, gpu: bool | GpuClass) -> int:
    """Peak GPU bytes of fine-tuning ``model`` as the profile does: notebook 10's recipe for its
    base (``shift.finetune``), the ablations' otherwise."""
    setup = profile.ablations.finetune
    if profile.shift.finetune is not None and model == (profile.shift.model or profile.ablations.model):
        setup = profile.shift.finetune
    if setup.method == "lora":
        return training_peak(model, profile, gpu, full=False, adapters=lora_adapter_params(model, setup.lora_rank))
    return training_peak(model, profile, gpu, full=True, trainable_share=_trainable_share(model, setup.trainable_layers))


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
    share = _trainable_share(model, setup.trainable_layers)
    plan.add(model, finetune_tokens=epochs * tokens)
    plan.model_bytes += checkpoints * int(_shape(model)["params"] * (4 + 8 * share))
    _peak(plan, training_peak(model, profile, gpu, full=True, trainable_share=share))


# ---------------------------------------------------------------- work per notebook


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
    reweighting model."""
    configs = sum(grid_size(profile, m) if grid else 1 for m in methods)
    runs = configs + len(methods) * (seeds - 1)
    plan.configs += configs
    plan.trainings += runs
    plan.seeds = max(plan.seeds, seeds)
    plan.epochs = profile.training.max_epochs
    plan.weights_bytes += len(methods) * int(4 * reweighter_params(model) * scale)
    plan.add(model, pair_epochs=runs * profile.training.max_epochs * counts.pairs * scale)


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

    plan = plans["05_table5_bdpl_wrapper"]
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

    plan = plans["11_table8_lora"]
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

    plan = plans["12_topk_logprobs"]
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

    # Notebook 14 at its own scale: the in-process view's work is timed like the others; the
    # API's is counted in requests (one per target token, one per generated token at most).
    plan = plans["14_api_model"]
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
    return list(plans.values())


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


def _trainable_share(model: str, trainable_layers: int | None) -> float:
    if trainable_layers is None:
        return 1.0
    return min(1.0, trainable_layers / _shape(model)["layers"])


# ---------------------------------------------------------------- rates


@dataclass(frozen=True)
class Rates:
    """Measured on this machine with ``measured_with``, in the dtype the run loads it in."""

    measured_with: str
    forward_tokens_per_s: float  # base forward (cache build, BDPL calls)
    train_pairs_per_s: float  # a reweighting model trained from a cache on the base's device
    decode_step_s: float  # one greedy step of the base at the profile's decoding batch
    plugin_step_s: float  # the same with the Plugin's logits processor
    device: str

    def seconds(self, work: dict, pair_tokens_fallback: float = 0.0) -> float:
        s = work.get("forward_tokens", 0.0) / self.forward_tokens_per_s
        s += work.get("pair_epochs", 0.0) / self.train_pairs_per_s
        s += work.get("decode_steps", 0) * self.decode_step_s + work.get("plugin_steps", 0) * self.plugin_step_s
        # Training through the base: forward + backward, about 3 forward passes per token (4 for
        # LoRA on a GPU, which recomputes activations); full fine-tuning runs in float32 (about
        # twice the half-precision cost on a GPU).
        recompute = 1 if self.device == "cuda" else 0
        s += (3 + recompute) * work.get("lora_tokens", 0.0) / self.forward_tokens_per_s
        float32 = 2 if self.device == "cuda" else 1
        s += 3 * float32 * work.get("finetune_tokens", 0.0) / self.forward_tokens_per_s
        return s


def _timed(fn, repeats: int = 1, warm_up: bool = True) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if warm_up:
        fn()
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - started) / repeats


def measure_rates(model: str, profile: Profile, counts: TaskCounts, device: torch.device) -> Rates:
    """A few seconds of measurement: the base's forward throughput on a batch of training
    pairs, greedy steps with and without the Plugin, and reweighting-model training steps
    from a cache of random log-probabilities held where the run would hold it. On a GPU the
    base is the model's full-size shape twin; on a CPU the model itself, on smaller batches."""
    gpu = device.type == "cuda"
    runner_model = shape_model(model) if gpu else model
    base = models.load_base_model(runner_model, dtype=profile.dtype, device=device)
    vocab = len(base.tokenizer)
    batch = profile.training.batch_size if gpu else min(2, profile.training.batch_size)
    length = max(8, int(round(counts.pair_tokens)))
    ids = torch.randint(3, vocab, (batch, length))
    base.logits(ids[:1, :8])  # warm-up
    forward = _timed(lambda: base.logits(ids), warm_up=gpu)

    decode_batch, steps = profile.decoding.batch_size, (8 if gpu else 3)
    prompt = torch.randint(3, vocab, (decode_batch, max(4, int(round(counts.prompt_tokens)))))
    mask = torch.ones_like(prompt)
    reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(model)).to(base.device)
    settings = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                    pad_token_id=base.tokenizer.pad_token_id)
    alone = _timed(lambda: base.generate(prompt, mask, **settings), warm_up=gpu)
    plugin = _timed(lambda: base.generate(prompt, mask, logits_processor=[PluginLogitsProcessor(reweighter, mask)],
                                          **settings), warm_up=gpu)

    target = max(2, length // 4)
    train_batch = profile.training.batch_size
    pairs = [EncodedPair(tuple(ids[i % batch].tolist()), length - target) for i in range(2 * train_batch)]
    rows = torch.randn(len(pairs) * target, base.vocab_size).log_softmax(-1).to(cache_dtype(base.dtype))
    cache = BaseOutputCache(rows, np.arange(len(pairs) + 1) * target)
    free, total = torch.cuda.mem_get_info(base.device) if gpu else (None, None)
    where = choose_placement(cache.nbytes, device_type=base.device.type, has_directory=False, gpu_free=free,
                             gpu_total=total, host_available=host_available_bytes())
    objective = TokenObjective(pairs, base.tokenizer.pad_token_id, cache=cache.placed(where, base.device))
    optimizer = torch.optim.AdamW(reweighter.parameters(), lr=1e-4)
    reweighter.train()
    steps_done = iter(range(0, len(pairs), train_batch))

    def train_step():
        start = next(steps_done)
        loss, n = objective.nll(reweighter, range(start, start + train_batch))
        optimizer.zero_grad(set_to_none=True)
        (loss / n).backward()
        optimizer.step()

    train = _timed(train_step)  # one warm-up step, one timed
    rates = Rates(runner_model, batch * length / forward, train_batch / train, alone / steps, plugin / steps,
                  base.device.type)
    del base, reweighter, objective, optimizer
    if gpu:
        torch.cuda.empty_cache()
    return rates


# ---------------------------------------------------------------- the report


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


def _disk_free() -> int:
    folder = config.results_dir()
    free = shutil.disk_usage(folder).free
    cache = config.cache_dir()
    if cache.stat().st_dev != folder.stat().st_dev:  # the cache directory is on another disk
        free = min(free, shutil.disk_usage(cache).free)
    return free


def estimated_rates(model: str, profile: Profile, card: GpuClass, counts: TaskCounts) -> Rates | None:
    """Rates of ``model`` on ``card`` from the H100 probe (``gpus``), or None for a base the
    probe did not cover: cache building and training scaled by the card's throughput (training
    from a compact cache adds its output layer's product), decoding by its memory bandwidth."""
    spec = models.model_spec(model)
    probe = gpus.probe_rates(spec.get("paper_model", spec["display"]))
    if probe is None or counts.pairs == 0:
        return None
    ratio, s = gpus.compute_ratio(card), _shape(model)
    train_s = ratio / probe["train"]
    if cache_layout(model, profile, card, counts.target_tokens) == "compact":
        train_s += counts.target_tokens / counts.pairs * gpus.head_s_per_token(card, s["hidden"], s["vocab"])
    step = gpus.decode_step_s(card, s["params"] * _bytes(load_dtype(model, profile, card)), s["layers"])
    return Rates(f"the H100 probe scaled to the {card.name} (an estimate)",
                 probe["cache"] * max(counts.pair_tokens, 1.0) / ratio, 1 / train_s, step,
                 step * gpus.PLUGIN_DECODE_RATIO, "cuda")


def _expected_share(work: dict, factor: float) -> dict:
    """``work`` with its trainings at the expected epochs (``factor`` of the cap)."""
    return {k: v * factor if k in ("pair_epochs", "lora_tokens") else v for k, v in work.items()}


def run(profile_name: str, *, gpu_memory_gb: float | None = None, disk_free_gb: float | None = None,
        measure: bool = True, plan_only: bool = False, gpu_name: str | None = None, only: str = "",
        out=sys.stdout) -> int:
    """Print the plan of ``profile_name``; the exit status (0 fine, 1 will not fit on this machine).
    ``plan_only``: the plan, with what would stop a run as warnings. ``gpu_name``: plan for that
    GPU class (``gpus.GPUS``): its memory, dtypes and hours estimated from its throughput.
    ``only``: check the GPU memory of the notebooks whose names start with it (run_all.sh --only)."""
    profile = config.load_profile(profile_name)
    card = gpus.gpu_class(gpu_name) if gpu_name else None
    has_gpu = torch.cuda.is_available()
    gpu_profile = profile.name in GPU_PROFILES
    gpu = card or has_gpu or gpu_profile  # the dtypes the run will use
    started = time.perf_counter()
    plans = plan_notebooks(profile, gpu)

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

    rates: dict[str, Rates | None] = {}
    for model in layouts:
        counts = count_task("e2e", model, profile)
        if card is not None:
            rates[model] = estimated_rates(model, profile, card, counts)
        elif measure and (has_gpu or not gpu_profile):
            rates[model] = measure_rates(model, profile, counts, config.device())
    factor, basis = (gpus.expected_epochs(profile)[0] / profile.training.max_epochs, gpus.expected_epochs(profile)[1])

    gpu_memory = (int(gpu_memory_gb * GIB) if gpu_memory_gb is not None else int(card.memory_gib * GIB) if card
                  else sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
                  if has_gpu else None)
    checks = Checks(gpu_memory=gpu_memory,
                    disk_free=int(disk_free_gb * GIB) if disk_free_gb is not None else _disk_free())
    header = ("notebook", "pairs", "target tok", "configs", "seeds", "epochs<=", "trainings", "decode tok<=",
              "cache GiB", "disk GiB", "peak GPU GiB", "fits", "hours<=", "hours~", "note")
    rows = []
    totals, untimed = [0.0, 0.0], []
    for plan in plans:
        seconds = expected = 0.0
        if plan.work and rates and all(rates.get(w["model"]) for w in plan.work):
            seconds = sum(rates[w["model"]].seconds(w) for w in plan.work)
            expected = sum(rates[w["model"]].seconds(_expected_share(w, factor)) for w in plan.work)
            totals = [totals[0] + seconds, totals[1] + expected]
        elif plan.work:
            seconds = expected = None
            untimed.append(plan.notebook[:2])
        peak = plan.peak_gpu if gpu else 0
        fits = "-" if not peak or checks.gpu_memory is None else "yes" if peak <= checks.gpu_memory else "NO"
        disk = plan.cache_bytes + plan.model_bytes + plan.weights_bytes
        rows.append((plan.notebook, f"{plan.pairs:,}", f"{plan.target_tokens:,}", plan.configs or "",
                     plan.seeds or "", plan.epochs or "", plan.trainings or "", f"{plan.decode_tokens:,}",
                     _gib(plan.cache_bytes), _gib(disk), _gib(peak) if peak else "-", fits,
                     _hours(seconds) if plan.work else "-", _hours(expected) if plan.work else "-", plan.note))
        if not plan.notebook.startswith(only):
            pass
        elif gpu and checks.gpu_memory is not None and peak > checks.gpu_memory:
            checks.failures.append(f"{plan.notebook} needs about {_gib(peak)} GiB of GPU memory; "
                                   f"{'the ' + card.name if card else 'this machine'} has "
                                   f"{_gib(checks.gpu_memory)} GiB ({plan.note or 'base, cache batch, decoding'}).")
        elif gpu and checks.gpu_memory is None and peak > 80 * GIB:
            checks.warnings.append(f"{plan.notebook} needs about {_gib(peak)} GiB of GPU memory: more than one "
                                   f"80 GiB GPU ({plan.note}).")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(v).ljust(w) if i in (0, len(header) - 1) else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths))).rstrip(), file=out)

    caches = sum(plan.cache_bytes for plan in plans)
    finetuned = sum(plan.model_bytes for plan in plans)
    weights = sum(plan.weights_bytes for plan in plans)
    written = caches + finetuned + weights
    print(f"\nDisk: base-output caches {_gib(caches)} GiB + fine-tuned models {_gib(finetuned)} GiB + "
          f"reweighting weights {_gib(weights)} GiB = {_gib(written)} GiB; {_gib(checks.disk_free)} GiB free.",
          file=out)
    if written > checks.disk_free:
        checks.failures.append(f"The caches, fine-tuned models and weights need {_gib(written)} GiB of disk; "
                               f"{_gib(checks.disk_free)} GiB are free under {config.results_dir()} and "
                               f"{config.cache_dir()} (PLUGIN_RESULTS_DIR, PLUGIN_CACHE_DIR move them).")
    for model, r in rates.items():
        if r is None:
            print(f"Rates for {model}: none (no measurement here, and the H100 probe did not cover it).", file=out)
            continue
        print(f"Rates for {model} ({'measured with ' if card is None else ''}{r.measured_with} on {r.device}): forward "
              f"{r.forward_tokens_per_s:,.0f} tokens/s, training {r.train_pairs_per_s:,.1f} pairs/s, "
              f"decoding {r.decode_step_s * 1000:,.1f} ms/step alone and {r.plugin_step_s * 1000:,.1f} ms/step "
              f"with the Plugin (Plugin/base {r.plugin_step_s / r.decode_step_s:.2f}) at batch "
              f"{profile.decoding.batch_size}.", file=out)
    if any(rates.values()):
        label = " (estimates)" if card is not None else ""
        left = f"; notebook(s) {', '.join(untimed)} not timed (no rate for a base)" if untimed else ""
        print(f"Total{label}: {_hours(totals[0])} hours at most (every training runs all its "
              f"{profile.training.max_epochs} epochs); about {_hours(totals[1])} hours at the expected "
              f"{factor * profile.training.max_epochs:.1f} epochs ({basis}){left}.", file=out)
    else:
        print("Times: this is a GPU profile and this machine has no GPU, so the hours need the GPU: run this "
              "command there (it measures the full-size shape twins for a few seconds), or name a GPU "
              f"(--gpu {'|'.join(gpus.GPUS)}) for estimates.", file=out)
        print(_reference_estimate(plans, profile), file=out)
    checks.warnings[:0] = [w for plan in plans for w in plan.warnings]
    if gpu_profile and not has_gpu and gpu_memory_gb is None and card is None:
        checks.failures.insert(0, f"profile '{profile.name}' needs a CUDA GPU and this machine has none. Here, "
                                  "run --profile local (the CPU-scale results) or paper-twin (this code path on "
                                  "small random twins); `python -m plugin_lib.harness.preflight --profile "
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


def _reference_estimate(plans: list[Plan], profile: Profile) -> str:
    """Cache building and training at the probed H100 rates (not measured here)."""
    build = train = 0.0
    for plan in plans:
        for work in plan.work:
            ref = reference_rates(work["model"])
            if ref is None:
                continue
            pair_tokens = count_task("e2e", work["model"], profile).pair_tokens
            build += work.get("forward_tokens", 0.0) / pair_tokens / ref["cache"]
            train += work.get("pair_epochs", 0.0) / ref["train"]
    return (f"For scale only, at H100 rates from an earlier probe of the paper's shapes (GPT2-M at GPT2-XL's): "
            f"building the caches {build / 3600:,.1f} h and training at most {train / 3600:,.0f} h "
            f"({train / 3600 / profile.training.max_epochs:,.1f} h per epoch of every training); "
            "decoding, BDPL, LoRA and fine-tuning are not included.")


def reference_rates(model: str) -> dict | None:
    """The probed H100 rates (cache building, training) of the paper base that ``model`` is or
    twins, or None for a base the probe did not cover."""
    spec = models.model_spec(model)
    return gpus.probe_rates(spec.get("paper_model", spec["display"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugin_lib.harness.preflight",
                                     description="The plan of a run: work, memory, disk and hours per notebook.")
    parser.add_argument("--profile", required=True, choices=config.profile_names())
    parser.add_argument("--gpu-memory-gb", type=float, help="check against this much GPU memory instead of the GPU's")
    parser.add_argument("--disk-free-gb", type=float, help="check against this much free disk instead of the disk's")
    parser.add_argument("--no-measure", action="store_true", help="counts only: measure no rates")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plan and stop nothing (what would stop a run becomes a warning)")
    parser.add_argument("--gpu", choices=list(gpus.GPUS),
                        help="plan for this GPU: its memory and dtypes, hours estimated from its published throughput")
    parser.add_argument("--only", default="", help="check the memory of the notebooks whose names start with this")
    args = parser.parse_args(argv)
    return run(args.profile, gpu_memory_gb=args.gpu_memory_gb, disk_free_gb=args.disk_free_gb,
               measure=not args.no_measure, plan_only=args.plan_only, gpu_name=args.gpu, only=args.only)


if __name__ == "__main__":
    sys.exit(main())
