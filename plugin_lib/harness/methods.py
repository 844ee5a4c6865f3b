"""The paper's methods on one (dataset, base model) task: how each is trained and how it decodes.

- Zeroshot: the base with the task prompt.
- ICL-1 / ICL-3: k demonstrations before the prompt. The profile's ``prompts: authors``: drawn
  once as the authors did (seed 42, with replacement, from the validation split's rows: the
  training and hyper-validation parts), the same for every test input and seed, so the seeds
  repeat one greedy run. ``appendix``: k distinct inputs of the training part, a new draw per
  seed and test input, after "Below are a list of demonstrations:" (``data.prompts``).
- NewModel: the reweighting architecture trained alone as a language model.
- WeightedComb: log(alpha * n + (1 - alpha) * b), the small model trained inside the mixture.
- TempNet (``harness.baselines.tempnet``): a small network reads the base's logits at the prompt's last
  position and predicts one temperature per input, trained with its authors' DRO loss; the
  base's logits are divided by it and TempNet *samples* (seeded, top-p and top-k from the
  profile's ``tempnet`` settings), as its authors decode it.
- TempNet-greedy: greedy decoding at TempNet's temperature. A positive temperature never
  changes an argmax (the repetition penalty comes before it), so these are Zeroshot's outputs,
  and it is decoded as Zeroshot, untrained (the runner reads the stored Zeroshot run's outputs):
  it is in the tables, labelled, beside the sampled TempNet that the paper compares against.
- Plugin: the reweighting model trained through the product b * r.
- LoRA (``EXTRA_METHODS``, Table 8 only): rank-8 adapters on the query and value projections
  of a private white-box copy of the base, trained on the same data, decoded like a base.
- ProxyTuning, DExperts (``PROXY_ARMS``, notebook 15): products of experts at decoding time,
  softmax(b + alpha * (e - a)) (alisawuffles/proxy-tuning, modeling/dexperts.py; DExperts first
  cuts b to its top-p nucleus). The expert e is NewModel's model, trained alone with NewModel's
  grid and budget (its selection and first seed's weights are NewModel's own); the anti-expert a
  is uniform for a small model trained from scratch, so ProxyTuning is then the base times a
  separately trained small model. A ``-pretrained`` arm's expert is a pretrained small model
  tuned alone (NewModel-pretrained) and its anti-expert the same model untuned (``proxy_expert``).
  alpha is chosen from the profile's ``proxy.alphas`` by hyper-validation loss, the selection
  rule of every method. The repetition penalty applies to each model's logits before they are
  combined, as for every method here (the authors apply it to the sum).

All methods share the prompts, the decoding settings (greedy except TempNet, max new tokens,
repetition penalty applied to each model's logits) and the metric code. The trained methods train on
60% of the validation split and stop early on the other 40% (the hyper-validation set).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..core.blackbox import BlackBoxLM
from ..core.combine import mixture_log_probs, proxy_combine, reachable_proxy_log_probs
from ..core.decode import generate
from ..core.reweighter import ExpertDifference, make_reweighter
from ..core.train import (FitResult, GridRun, TokenObjective, TrainConfig, configs_that_fit, fit_grid, grid_pays,
                          mean_nlls_of_rules, reachable_plugin_log_probs, small_model_log_probs)
from . import models
from .baselines.lora import LoraModel, lora_black_box, lora_objective, lora_on
from .profile import Decoding, ProxySettings, Training
from .tasks import Task, tempnet_settings
from .baselines.tempnet import TempNetObjective, make_tempnet, tempnet_generate

METHODS = ("Zeroshot", "ICL-1", "ICL-3", "NewModel", "WeightedComb", "TempNet", "TempNet-greedy", "Plugin")
TRAINED_METHODS = ("NewModel", "WeightedComb", "TempNet", "Plugin")
# Deterministic and untrained: one run (the first seed) stands for every seed.
UNSEEDED_METHODS = ("Zeroshot", "TempNet-greedy")
ICL_SHOTS = {"ICL-1": 1, "ICL-3": 3}
# Trained methods outside the main tables (notebooks 01-04 run METHODS): the white-box reference.
EXTRA_METHODS = ("LoRA",)
# Decoding-time products of experts (notebook 15), each over an expert trained as NewModel.
PROXY_ARMS = ("ProxyTuning", "DExperts")
EXPERT_METHOD = "NewModel"


def check_method(method: str) -> None:
    known = METHODS + EXTRA_METHODS + PROXY_ARMS
    if method not in known:
        raise ValueError(f"Unknown method {method!r}. Choose one of: {', '.join(known)}.")


def trained_as(method: str) -> str:
    """The method whose small model ``method`` trains: NewModel's for a proxy arm."""
    return EXPERT_METHOD if method in PROXY_ARMS else method


def proxy_expert(task: Task, expert: nn.Module, arch: dict, seed: int) -> nn.Module:
    """What a proxy arm adds to the base: a pretrained expert (``arch["arch"] == "pretrained"``)
    less its anti-expert, the same pretrained model untuned (proxy-tuning's own pairing); any other
    expert alone, its anti-expert uniform (a small model with no untuned state worth subtracting)."""
    if arch.get("arch") != "pretrained":
        return expert
    return ExpertDifference(expert, build_model(task, EXPERT_METHOD, arch, seed).eval())


def proxy_top_p(method: str, settings: ProxySettings) -> float | None:
    return settings.top_p if method == "DExperts" else None


@torch.no_grad()
def choose_alpha(task: Task, method: str, expert: nn.Module, settings: ProxySettings) -> tuple[float, dict]:
    """(alpha, hyper-validation loss per alpha): the alpha of ``settings.alphas`` whose
    combination of the base and ``expert`` has the lowest hyper-validation loss (ties: the
    smaller alpha), on the base's cached outputs. The loss at alpha 0, the base alone (cut to its
    nucleus for DExperts), is kept beside them and never chosen: whether the expert helps the
    base at all is the arm's premise."""
    top_p = proxy_top_p(method, settings)
    alphas = (0.0, *settings.alphas)
    hyper = TokenObjective(task.encoded("hyper"), task.base.tokenizer.pad_token_id, cache=task.base_cache("hyper"))
    rules = functools.partial(reachable_proxy_log_probs, alphas=alphas, top_p=top_p)
    losses = dict(zip((f"{alpha:g}" for alpha in alphas), mean_nlls_of_rules(hyper, expert, rules)))
    best = min(settings.alphas, key=lambda a: (losses[f"{a:g}"], a))
    return best, losses


# ---------------------------------------------------------------- LoRA

def make_lora(task: Task, seed: int) -> LoraModel:
    """Rank-8 LoRA on a fresh copy of the base (the black box's own weights stay untouched)."""
    model, _ = models.load_causal_lm(task.base.name, dtype=task.base.dtype, device=task.base.device)
    return lora_on(model, seed, recompute=task.lora_recompute)


# ---------------------------------------------------------------- training


def build_model(task: Task, method: str, arch: dict, seed: int) -> nn.Module:
    """A freshly initialised small model of ``method`` on the base's device."""
    if method not in TRAINED_METHODS + EXTRA_METHODS:
        raise ValueError(f"{method} has nothing to train; trained methods: {', '.join(TRAINED_METHODS)}.")
    if method == "LoRA":
        return make_lora(task, seed)
    if method == "TempNet":
        model = make_tempnet(task.base.vocab_size, tempnet_settings(task), seed)
    else:
        model = make_reweighter(vocab_size=task.base.vocab_size, seed=seed, **arch)
    return model.to(task.base.device)


def objective(task: Task, method: str, split: str, hparams: dict) -> TokenObjective:
    """The training loss of ``method`` on ``split`` ("train" or "hyper")."""
    pad = task.base.tokenizer.pad_token_id
    if method == "NewModel":
        return TokenObjective(task.encoded(split), pad, log_probs=small_model_log_probs)
    if method == "LoRA":
        return lora_objective(task.encoded(split), pad)
    if method == "TempNet":
        settings = tempnet_settings(task)
        return TempNetObjective(task.encoded(split), pad, cache=task.base_cache(split), rho=settings.rho,
                                per_token=settings.per == "token")
    log_probs = (
        # reachable_: on a top-k view that rules tokens out (renormalize), targets outside the
        # top k are left out of the loss instead of making it infinite; otherwise plugin_log_probs.
        reachable_plugin_log_probs if method == "Plugin"
        else functools.partial(mixture_log_probs, alpha=hparams["alpha"])
    )
    return TokenObjective(task.encoded(split), pad, log_probs=log_probs, cache=task.base_cache(split))


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """One small model to train: ``method``'s model of architecture ``arch``, with ``hparams``
    (the grid's keys: ``run_keys.grid_keys``) and ``seed``, under the profile's ``settings``.
    ``checkpoint``: where an interrupted training resumes from; it holds the finished training
    until the caller, having stored its result, removes it. Checked once, when it is made."""

    method: str
    arch: dict
    hparams: dict
    seed: int
    settings: Training
    checkpoint: Path | None = None

    def __post_init__(self):
        if self.method not in TRAINED_METHODS + EXTRA_METHODS:
            raise ValueError(f"{self.method} has nothing to train; trained methods: "
                             f"{', '.join(TRAINED_METHODS + EXTRA_METHODS)}.")
        needed = {"lr", "weight_decay"} | ({"alpha"} if self.method == "WeightedComb" else set())
        if not needed <= set(self.hparams):
            raise ValueError(f"{self.method}'s training needs hyperparameters {sorted(needed)}, got {self.hparams}.")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed must be an integer, got {self.seed!r}.")


def training_run(task: Task, spec: TrainingSpec) -> GridRun:
    """What training ``spec`` needs (``core.train.fit_grid``): a fresh model, the training and
    hyper-validation objectives, the settings."""
    cfg = TrainConfig(lr=spec.hparams["lr"], weight_decay=spec.hparams["weight_decay"], seed=spec.seed,
                      **dataclasses.asdict(spec.settings))  # epochs, patience, batch size, warmup
    train, hyper = (objective(task, spec.method, split, spec.hparams) for split in ("train", "hyper"))
    return GridRun(build_model(task, spec.method, spec.arch, spec.seed), train, hyper, cfg, spec.checkpoint,
                   keep_checkpoint=spec.checkpoint is not None)


def configs_at_once(task: Task, method: str, arch: dict, pending: int) -> int:
    """How many of ``pending`` configurations to train together (``core.train.configs_that_fit``)
    where it pays (``grid_pays``); LoRA, which trains through the base, one at a time."""
    if method == "LoRA" or pending <= 1:
        return min(1, pending)
    cache = None if method == "NewModel" else task.base_cache("train")
    if not grid_pays(task.base.device, cache):
        return 1
    return configs_that_fit(build_model(task, method, arch, seed=0), pending)


def train(task: Task, spec: TrainingSpec, *, progress: bool = True) -> tuple[nn.Module, FitResult]:
    """Train ``spec``'s small model on the task's training part; early-stop on hyper."""
    run = training_run(task, spec)
    return run.model, fit_grid([run], progress=progress)[0]


def train_together(task: Task, specs: Sequence[TrainingSpec], *, progress: bool = True
                   ) -> list[tuple[nn.Module, FitResult]]:
    """``train`` for several configurations of a grid at once (``core.train.fit_grid``): one
    pass over the data for all, each result as if trained alone; stepped as one stacked model
    where the task says so (``Task.stacked_training``)."""
    runs = [training_run(task, spec) for spec in specs]
    results = fit_grid(runs, progress=progress, stack=task.stacked_training)
    return [(run.model, result) for run, result in zip(runs, results)]


# ---------------------------------------------------------------- decoding


def static_decoding(task: Task, method: str) -> bool:
    """Whether ``predict`` decodes ``method`` from static caches: where the task says so
    (``Task.static_decoding``), for every method but TempNet, which samples with its own loop."""
    return task.static_decoding and method != "TempNet"


def predict(
    task: Task, method: str, model: nn.Module | None, seed: int, decoding: Decoding, hparams: dict | None = None,
    *, progress: bool = True,
) -> list[str]:
    """One output per test input."""
    check_method(method)
    settings = dict(
        batch_size=decoding.batch_size,
        max_new_tokens=decoding.max_new_tokens,
        repetition_penalty=decoding.repetition_penalty,
        progress=progress,
    )
    if static_decoding(task, method):
        settings["static_cache"] = True
    test_prompts = [task.prompt(ex) for ex in task.test]
    truncate = dict(max_prompt_tokens=task.max_prompt_tokens)
    if method in ("Zeroshot", "TempNet-greedy"):
        return generate(task.base, test_prompts, None, **settings, **truncate)
    if method in ICL_SHOTS:
        # Demonstrations make the prompt long: it is not truncated (that would cut the query).
        icl_prompts = [task.prompt(ex, demos)
                       for ex, demos in zip(task.test, task.demonstrations(ICL_SHOTS[method], seed))]
        return generate(task.base, icl_prompts, None, **settings)
    if method == "NewModel":
        return generate(BlackBoxLM(model, task.base.tokenizer, "NewModel"), test_prompts, None, **settings, **truncate)
    if method == "Plugin":
        return generate(task.base, test_prompts, model, **settings, **truncate)
    if method == "LoRA":
        # Unmerged: merging would rewrite the model in place; adapters add < 1% FLOPs per token.
        adapted = lora_black_box(model.peft, task.base.tokenizer, merge=False, name="LoRA")
        return generate(adapted, test_prompts, None, **settings, **truncate)
    if method == "WeightedComb":
        combine = functools.partial(mixture_log_probs, alpha=hparams["alpha"])
        return generate(task.base, test_prompts, model, combine=combine, **settings, **truncate)
    if method in PROXY_ARMS:
        combine = functools.partial(proxy_combine, alpha=hparams["alpha"], top_p=hparams.get("top_p"))
        return generate(task.base, test_prompts, model, combine=combine, **settings, **truncate)
    # TempNet: sampled at its temperature, seeded, by its own loop.
    sampling = tempnet_settings(task)
    texts, _ = tempnet_generate(task.base, test_prompts, model, seed=seed, top_p=sampling.top_p,
                                top_k=sampling.top_k, per_token=sampling.per == "token",
                                temperature=sampling.temperature, **settings, **truncate)
    return texts
