"""The reweighting models an ablation compares, and their runs: the family's model with k layers,
a pretrained initialisation (GPT2-Small for GPT-2 bases, as the paper; otherwise the base's own
public checkpoint cut to its first blocks, ``truncated_pretrained``), an MLP and a linear model
(``experiments.ablations`` explains why). ``variant_jobs`` lists the runs, which the notebooks
and the grid's units share (``grid.units``); ``variant_frame`` gives each model's size and
starting loss.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ...core.reweighter import count_parameters
from ...core.train import TokenObjective, small_model_log_probs
from .. import methods, models, tasks
from ..running import runner, search
from .finetune import decoder_layers, save_model_dir
from ..machine import cache_dir
from ..profile import Profile

ONE_LAYER = "Plugin"  # label of the family's default (1-layer) reweighting model


def small_model(model_name: str) -> dict | None:
    """The base family's small pretrained model (``small_model`` of its entry in profiles.yaml:
    ``hub_id`` and ``display``), or None where the registry names none."""
    try:
        return models.model_spec(model_name).get("small_model")
    except ValueError:
        return None


@dataclass(frozen=True)
class Variant:
    """One reweighting model of an ablation."""

    label: str  # the run's method field and file name
    arch: dict | None  # for make_reweighter; None: the family's default (shares the main runs)
    name: str  # for figures and tables


def truncated_pretrained(model_name: str, n_layers: int) -> Path:
    """``model_name``'s public checkpoint cut to its first ``n_layers`` blocks, with its own
    embeddings, final norm and output head (a twin: built with ``n_layers`` blocks); saved once
    under the cache directory."""
    safe = model_name.replace("/", "--")
    twin = models.is_twin(model_name)
    # A twin's stand-in is built at that depth from the twin's seed (random weights either way),
    # not cut: other weights than the cut twin's, hence another name.
    target = cache_dir() / "models" / (f"{safe}-{n_layers}layers" if twin else f"{safe}-first{n_layers}layers")
    if (target / "config.json").exists():
        return target
    if twin:
        origin = {"source": model_name, "layers_kept": n_layers,
                  "layers_of_source": models.model_config(model_name).num_hidden_layers}
        model, tokenizer = models.build_twin_blocks(model_name, n_layers)
        return save_model_dir(target, model, tokenizer, {"truncated.json": origin})
    model, tokenizer = models.load_causal_lm(model_name, dtype=torch.float32, device="cpu")
    layers = decoder_layers(model)
    origin = {"source": model_name, "layers_kept": n_layers, "layers_of_source": len(layers)}
    if not 1 <= n_layers < len(layers):
        raise ValueError(f"n_layers must be in 1..{len(layers) - 1} for {model_name}, got {n_layers}.")
    del layers[n_layers:]
    model.config.num_hidden_layers = n_layers
    return save_model_dir(target, model, tokenizer, {"truncated.json": origin})


def pretrained_variant(model_name: str, n_layers: int | None) -> Variant:
    """The pretrained reweighting model of notebooks 07 and 15 (one run, Plugin-pretrained): the
    base family's :func:`small_model` where profiles.yaml names one (GPT2-Small for GPT-2, as the
    paper; LLaMA-3.2-1B for LLaMA-3.1-8B); otherwise the base's own checkpoint, truncated."""
    small = small_model(model_name)
    if small is not None:
        return Variant("Plugin-pretrained", {"arch": "pretrained", "pretrained": small["hub_id"]},
                       f"pretrained: {small['display']}")
    if n_layers is None:
        raise ValueError(f"No pretrained reweighting model is known for {model_name}: set pretrained_layers.")
    path = truncated_pretrained(model_name, n_layers)
    display = models.model_spec(model_name)["display"]
    blocks = "block" if n_layers == 1 else "blocks"
    return Variant("Plugin-pretrained", {"arch": "pretrained", "pretrained": str(path)},
                   f"pretrained: {display}, first {n_layers} {blocks}")


def expert_variant(model_name: str, n_layers: int | None) -> Variant:
    """The pretrained small model of notebook 15's ``-pretrained`` arms: proxy-tuning's expert
    (tuned alone) and anti-expert (untuned), and the Plugin's starting point: the family's
    :func:`small_model`; otherwise :func:`pretrained_variant`'s (the base cut to ``n_layers``
    blocks: a weaker stand-in, labelled so). The same model as notebook 07's Plugin-pretrained."""
    variant = pretrained_variant(model_name, n_layers)
    stand_in = "" if small_model(model_name) else " (a stand-in for a pretrained small model)"
    return Variant("pretrained", variant.arch, variant.name + stand_in)


def complexity_variants(model_name: str, layers: Sequence[int], pretrained_layers: int | None,
                        *, pretrained: bool = True) -> list[Variant]:
    """The family's reweighting model with each number of layers, then (``pretrained``) the
    pretrained one."""
    default = search.arch_for(model_name)
    variants = [
        Variant(ONE_LAYER, None, "1 layer") if k == default["n_layer"]
        else Variant(f"Plugin-{k}L", {**default, "n_layer": k}, f"{k} layers")
        for k in layers
    ]
    return variants + ([pretrained_variant(model_name, pretrained_layers)] if pretrained else [])


def architecture_variants(model_name: str) -> list[Variant]:
    """Transformer layer (the family's default), two-layer ReLU MLP and linear, same widths."""
    default = search.arch_for(model_name)
    width = default.get("hidden_size", 768)  # GPT2Config's default width for GPT-2 families
    inner = default.get("intermediate_size", 4 * width)
    return [
        Variant(ONE_LAYER, None, "transformer layer"),
        Variant("Plugin-MLP", {"arch": "mlp", "hidden_size": width, "intermediate_size": inner},
                "MLP (2 layers, ReLU)"),
        Variant("Plugin-linear", {"arch": "linear", "hidden_size": width}, "linear"),
    ]


def one_layer_profile(task: tasks.Task, profile: Profile, *, progress: bool = False) -> Profile:
    """The profile with its grid narrowed to the hyperparameters chosen for the 1-layer Plugin
    (searched first if they are not stored yet)."""
    return search.narrowed_profile(task, profile, "Plugin", progress=progress)


def variant_runs(task: tasks.Task, profile: Profile, variants: Sequence[Variant], seeds: Sequence[int],
                 *, hparams: str = "own", progress: bool = False) -> list[dict]:
    """Zeroshot (the base alone) and a Plugin run per variant and seed. ``hparams="own"``: each
    variant searches the profile's grid; ``"one-layer"``: the others reuse the 1-layer choice."""
    records, narrowed = [], None
    for job in variant_jobs(variants, seeds, hparams):
        if job.narrow:
            narrowed = narrowed or one_layer_profile(task, profile, progress=progress)
        records.append(runner.run_experiment(task, job.method, job.seed, narrowed if job.narrow else profile,
                                             arch=job.arch, label=job.label, progress=progress))
    return records


@dataclass(frozen=True)
class VariantJob:
    """One run of :func:`variant_runs` (also a unit of the grid, ``harness.grid``). ``narrow``:
    trained on the 1-layer Plugin's chosen hyperparameters (``one_layer_profile``)."""

    method: str
    seed: int
    label: str
    arch: dict | None = None
    narrow: bool = False


def variant_jobs(variants: Sequence[Variant], seeds: Sequence[int], hparams: str = "own") -> list[VariantJob]:
    """Zeroshot once, then each variant's Plugin run per seed, in :func:`variant_runs`'s order."""
    if hparams not in ("own", "one-layer"):
        raise ValueError(f"hparams must be 'own' or 'one-layer', got {hparams!r}.")
    jobs = [VariantJob("Zeroshot", seeds[0], "Zeroshot")]
    for variant in variants:
        narrow = hparams == "one-layer" and variant.label != ONE_LAYER
        jobs += [VariantJob("Plugin", seed, variant.label, variant.arch, narrow) for seed in seeds]
    return jobs


def variant_frame(task: tasks.Task, variants: Sequence[Variant], seed: int = 0) -> pd.DataFrame:
    """Each reweighting model's size and, before any training, its hyper-validation loss
    (nats per target token) alone and inside the Plugin. A randomly initialised model is
    close to uniform, so its Plugin starts at about the base's own loss; a pretrained one
    starts wherever its own predictions put it."""
    default = search.arch_for(task.base.name)
    alone = TokenObjective(task.encoded("hyper"), task.base.tokenizer.pad_token_id, log_probs=small_model_log_probs)
    plugin = methods.objective(task, "Plugin", "hyper", {})
    rows = []
    for variant in variants:
        model = methods.build_model(task, "Plugin", variant.arch or default, seed)
        rows.append({"label": variant.label, "reweighting model": variant.name,
                     "parameters": count_parameters(model),
                     "loss alone at init": alone.mean_nll(model),
                     "Plugin loss at init": plugin.mean_nll(model)})
    # Recomputed at every execution: 4 decimals keep the table the same across thread counts.
    return pd.DataFrame(rows).round({"loss alone at init": 4, "Plugin loss at init": 4})
