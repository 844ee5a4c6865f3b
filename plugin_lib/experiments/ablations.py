"""The paper's ablations of the Plugin: base-model quality (Figures 2 and 5), complexity of the
reweighting model (Figures 3 and 6) and its architecture (Figure 7).

Every run goes through ``runner.run_experiment``, so it is stored, resumed and scored like the
main tables; runs that equal a main-table run (the original base, the family's 1-layer
reweighting model) share its file instead of being redone.

- Base quality: the base is fine-tuned for 0, 1, 2 and 5 epochs (``harness.finetune``)
  on a pool of inputs disjoint from the Plugin's data and from the test split
  (``harness.finetune.finetune_pool``), and Zeroshot and a Plugin run on each. A fine-tuned base is a
  black box again, with its own run folder (``finetuned--<its directory name>``).
- Complexity: the family's reweighting model with 1 to 12 layers, and a pretrained model of
  the base's vocabulary as initialisation. The paper uses GPT2-Small for GPT2-M. SmolLM2 has
  no smaller public sibling with its vocabulary offline, so the analogue is SmolLM2-135M's own
  public checkpoint cut to its first k blocks, with its own embeddings, final norm and (tied)
  output head (:func:`truncated_pretrained`). Unlike GPT2-Small, which was trained separately
  from GPT2-M, this model shares its weights with the base: it starts as a shallow copy of the
  base itself, so what it adds is mostly a good starting point for the embeddings and the
  lower blocks, not a second opinion; and it needs the base's public weights, which a truly
  closed model would not give.
- Architecture: a transformer layer (the family's default), a two-layer ReLU MLP and a linear
  model on the current token's embedding, same widths (``models.ContextFreeReweighter``).

The sizes per profile are the profile's ``ablations`` section (profiles.yaml); the ``check_*``
functions test the paper's claims on the numbers of a run and say whether it supports them.
"""
from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from .. import data
from ..core.reweighter import count_parameters
from ..core.train import TokenObjective, small_model_log_probs
from ..harness import methods, models, runner
from ..harness import finetune
from ..harness.finetune import decoder_layers, finetune_info, save_model_dir
from ..harness.profile import Ablations, Profile, cache_dir
from ..metrics import METRIC_NAMES
from ..report import tables
from ..report.claims import record_claim

# GPT2-Small shares GPT-2's tokenizer: the paper's pretrained reweighting model.
PAPER_PRETRAINED = {"gpt2-medium": "gpt2", "gpt2-xl": "gpt2"}
ONE_LAYER = "Plugin"  # label of the family's default (1-layer) reweighting model


def settings(profile: Profile, **overrides) -> Ablations:
    """The ablation sizes of ``profile`` (its ``ablations`` section); overrides that are None
    keep the profile's value, the others are type-checked like any profile field."""
    ablations_section = dataclasses.asdict(profile.ablations)
    unknown = set(overrides) - set(ablations_section)
    if unknown:
        raise ValueError(f"Unknown ablation setting(s) {sorted(unknown)}; known: {sorted(ablations_section)}.")
    ablations_section.update({k: v for k, v in overrides.items() if v is not None})
    return profile.replace(ablations=ablations_section).ablations


def seeds_for(setup: Ablations, ablation: str, profile: Profile) -> list[int]:
    """Seeds of one ablation ("base_quality", "complexity", "architecture")."""
    return list(getattr(setup, f"{ablation}_seeds") or profile.seeds)


def _mean_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per-method rows of a one-model ``tables.summarize`` result."""
    models = summary.index.get_level_values("model").unique()
    if len(models) != 1:
        raise ValueError(f"Expected the runs of one base model, got {list(models)}.")
    return summary.droplevel("model")


def _verdict(supported: bool, text: str) -> str:
    return f"{'Supported' if supported else 'Not supported'}: {text}"


def record_claims(profile: Profile | str, claims: dict[str, str], ablation: str, dataset: str, paper: str) -> list[dict]:
    """Put the ``check_*`` sentences of one notebook into the reproduction report."""
    return [
        record_claim(profile, f"{ablation}_{dataset}_{i}", f"{dataset}: {claim}", paper, sentence,
                     "reproduced" if sentence.startswith("Supported") else "not reproduced")
        for i, (claim, sentence) in enumerate(claims.items())
    ]


def _numbers(values: pd.Series) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in values.items())


# ---------------------------------------------------------------- base-model quality


def base_label(epochs: int) -> str:
    """The paper's names: 1FT, 2FT, 5FT; 0FT is the original base."""
    return f"{epochs}FT"


def base_quality_runs(dataset: str, profile: Profile, model_name: str, bases: dict[int, str | Path],
                      seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot and Plugin on every base; each record gets its ``finetune_epochs``."""
    arch = runner.arch_for(model_name)
    records = []
    for epochs, source in bases.items():
        base = model_name if epochs == 0 else finetune.load_finetuned_base(source, dtype=profile.dtype)
        task = runner.load_task(base, dataset, profile, prompt_model=model_name)
        runs = [runner.run_experiment(task, "Zeroshot", seeds[0], profile, progress=progress)]
        runs += [runner.run_experiment(task, "Plugin", seed, profile, arch=arch, progress=progress) for seed in seeds]
        records += [{**record, "finetune_epochs": epochs} for record in runs]
    return records


def base_quality_frame(records: Sequence[dict]) -> pd.DataFrame:
    """``tables.runs_frame`` with the base named by its fine-tuning epochs (0FT, 1FT, ...)."""
    frame = tables.runs_frame(records)
    frame["model"] = [base_label(r["finetune_epochs"]) for r in records]
    return frame


def finetune_frame(bases: dict[int, str | Path]) -> pd.DataFrame:
    """What each fine-tuned base was trained on, its last training loss and the time it took."""
    rows = []
    for epochs, path in bases.items():
        if epochs == 0:
            continue
        info = finetune_info(path)
        rows.append({
            "base": base_label(epochs),
            "pool": info["pool"],
            "pairs": info["pairs"],
            "trainable parameters": info["trainable_parameters"],
            "train loss (last epoch)": info["history"][-1]["train_loss"],
            "seconds (all epochs)": sum(h["seconds"] for h in info["history"]),
        })
    return pd.DataFrame(rows)


def _by_base(summary: pd.DataFrame, method: str, order: Sequence[str]) -> pd.DataFrame:
    return summary.xs(method, level="method").reindex(list(order))


def _rank_correlation(x, y) -> float:
    rho = spearmanr(np.asarray(x, float), np.asarray(y, float)).statistic
    # Over a few ranks rho is a ratio of small integers; rounding drops float noise so that
    # one neighbour swap of four (rho = 0.8, computed as 0.7999999999999999) meets 0.8.
    return round(float(rho), 12) if np.isfinite(rho) else float("nan")


def check_base_quality(summary: pd.DataFrame, order: Sequence[str], metrics: Sequence[str] = METRIC_NAMES,
                       min_rho: float = 0.8) -> str:
    """Paper: "as the base model's task-specific quality improves, the Plugin's performance
    improves". Supported when, on most metrics, the Plugin's score rises with the base's own
    (Zeroshot) score over the bases in ``order``: Spearman rho >= ``min_rho`` (with four bases,
    0.8 allows one swap of neighbours)."""
    base, plugin = _by_base(summary, "Zeroshot", order), _by_base(summary, "Plugin", order)
    rho = pd.Series({m: _rank_correlation(base[m], plugin[m]) for m in metrics})
    base_rises = sum(_rank_correlation(range(len(order)), base[m]) >= min_rho for m in metrics)
    rising = rho[rho >= min_rho]
    return _verdict(
        len(rising) > len(metrics) / 2,
        f"the Plugin's score rises with the base's own score (Spearman rho >= {min_rho} over "
        f"{', '.join(order)}) on {len(rising)}/{len(metrics)} metrics (rho: "
        + ", ".join(f"{m} {r:.2f}" for m, r in rho.items())
        + f"); the base's own score rises with the fine-tuning epochs on {base_rises}/{len(metrics)} metrics.",
    )


def check_plugin_beats_base(summary: pd.DataFrame, order: Sequence[str], metrics: Sequence[str] = METRIC_NAMES) -> str:
    """Paper (Figure 5): the Plugin improves on its base "regardless of the strength of the
    base model". Supported when, on most metrics, the Plugin beats Zeroshot on every base."""
    gain = _by_base(summary, "Plugin", order)[list(metrics)] - _by_base(summary, "Zeroshot", order)[list(metrics)]
    everywhere = [m for m in metrics if (gain[m] > 0).all()]
    return _verdict(
        len(everywhere) > len(metrics) / 2,
        f"the Plugin beats its base on every base ({', '.join(order)}) on {len(everywhere)}/{len(metrics)} "
        "metrics; its smallest gain per metric: " + _numbers(gain.min()) + ".",
    )


def plot_base_quality(summary: pd.DataFrame, order: Sequence[str], metrics: Sequence[str] = METRIC_NAMES) -> plt.Figure:
    """One panel per metric: the base alone and the Plugin on it, against fine-tuning epochs."""
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.2))
    x = np.arange(len(order))
    for ax, metric in zip(axes.flat, metrics):
        for method, name, marker in (("Zeroshot", "base alone (Zeroshot)", "o"), ("Plugin", "Plugin", "s")):
            rows = _by_base(summary, method, order)
            ax.errorbar(x, rows[metric], yerr=rows[f"{metric}_std"].fillna(0.0), marker=marker, capsize=3, label=name)
        ax.set_xticks(x, order)
        ax.set_title(metric)
    legend_ax = axes.flat[len(metrics)]
    legend_ax.legend(*axes.flat[0].get_legend_handles_labels(), loc="center")
    for ax in axes.flat[len(metrics):]:
        ax.axis("off")
    fig.supxlabel("base fine-tuned for k epochs (kFT; 0FT = original base)")
    fig.tight_layout()
    plt.close(fig)
    return fig


# ---------------------------------------------------------------- reweighting models


@dataclass(frozen=True)
class Variant:
    """One reweighting model of an ablation."""

    label: str  # the run's method field and file name
    arch: dict | None  # for make_reweighter; None: the family's default (shares the main runs)
    name: str  # for figures and tables


def truncated_pretrained(model_name: str, n_layers: int) -> Path:
    """``model_name``'s public checkpoint cut to its first ``n_layers`` blocks, with its own
    embeddings, final norm and output head; saved once under the cache directory."""
    safe = model_name.replace("/", "--")
    target = cache_dir() / "models" / f"{safe}-first{n_layers}layers"
    if (target / "config.json").exists():
        return target
    model, tokenizer = models.load_causal_lm(model_name, dtype=torch.float32, device="cpu")
    layers = decoder_layers(model)
    origin = {"source": model_name, "layers_kept": n_layers, "layers_of_source": len(layers)}
    if not 1 <= n_layers < len(layers):
        raise ValueError(f"n_layers must be in 1..{len(layers) - 1} for {model_name}, got {n_layers}.")
    del layers[n_layers:]
    model.config.num_hidden_layers = n_layers
    return save_model_dir(target, model, tokenizer, {"truncated.json": origin})


def pretrained_variant(model_name: str, n_layers: int | None) -> Variant:
    """GPT2-Small for GPT-2 bases (the paper); otherwise the base's own checkpoint, truncated."""
    if model_name in PAPER_PRETRAINED:
        return Variant("Plugin-pretrained", {"arch": "pretrained", "pretrained": PAPER_PRETRAINED[model_name]},
                       "pretrained: GPT2-Small")
    if n_layers is None:
        raise ValueError(f"No pretrained reweighting model is known for {model_name}: set pretrained_layers.")
    path = truncated_pretrained(model_name, n_layers)
    display = models.model_spec(model_name)["display"]
    blocks = "block" if n_layers == 1 else "blocks"
    return Variant("Plugin-pretrained", {"arch": "pretrained", "pretrained": str(path)},
                   f"pretrained: {display}, first {n_layers} {blocks}")


def complexity_variants(model_name: str, layers: Sequence[int], pretrained_layers: int | None) -> list[Variant]:
    """The family's reweighting model with each number of layers, then the pretrained one."""
    default = runner.arch_for(model_name)
    variants = [
        Variant(ONE_LAYER, None, "1 layer") if k == default["n_layer"]
        else Variant(f"Plugin-{k}L", {**default, "n_layer": k}, f"{k} layers")
        for k in layers
    ]
    return variants + [pretrained_variant(model_name, pretrained_layers)]


def architecture_variants(model_name: str) -> list[Variant]:
    """Transformer layer (the family's default), two-layer ReLU MLP and linear, same widths."""
    default = runner.arch_for(model_name)
    width = default.get("hidden_size", 768)  # GPT2Config's default width for GPT-2 families
    inner = default.get("intermediate_size", 4 * width)
    return [
        Variant(ONE_LAYER, None, "transformer layer"),
        Variant("Plugin-MLP", {"arch": "mlp", "hidden_size": width, "intermediate_size": inner},
                "MLP (2 layers, ReLU)"),
        Variant("Plugin-linear", {"arch": "linear", "hidden_size": width}, "linear"),
    ]


def one_layer_profile(task: methods.Task, profile: Profile, *, progress: bool = False) -> Profile:
    """The profile with its grid narrowed to the hyperparameters chosen for the 1-layer Plugin
    (searched first if they are not stored yet)."""
    record = runner.select_hparams(task, "Plugin", profile, progress=progress)
    chosen = record["configs"][record["best"]]["hparams"]
    return profile.replace(grid=dataclasses.replace(profile.grid, **{k: (v,) for k, v in chosen.items()}))


def variant_runs(task: methods.Task, profile: Profile, variants: Sequence[Variant], seeds: Sequence[int],
                 *, hparams: str = "own", progress: bool = False) -> list[dict]:
    """Zeroshot (the base alone) and a Plugin run per variant and seed. ``hparams="own"``: each
    variant searches the profile's grid; ``"one-layer"``: the others reuse the 1-layer choice."""
    if hparams not in ("own", "one-layer"):
        raise ValueError(f"hparams must be 'own' or 'one-layer', got {hparams!r}.")
    records = [runner.run_experiment(task, "Zeroshot", seeds[0], profile, progress=progress)]
    for variant in variants:
        reuse = hparams == "one-layer" and variant.label != ONE_LAYER
        variant_profile = one_layer_profile(task, profile, progress=progress) if reuse else profile
        for seed in seeds:
            records.append(runner.run_experiment(task, "Plugin", seed, variant_profile, arch=variant.arch,
                                                 label=variant.label, progress=progress))
    return records


def variant_frame(task: methods.Task, variants: Sequence[Variant], seed: int = 0) -> pd.DataFrame:
    """Each reweighting model's size and, before any training, its hyper-validation loss
    (nats per target token) alone and inside the Plugin. A randomly initialised model is
    close to uniform, so its Plugin starts at about the base's own loss; a pretrained one
    starts wherever its own predictions put it."""
    default = runner.arch_for(task.base.name)
    alone = TokenObjective(task.encoded("hyper"), task.base.tokenizer.pad_token_id, log_probs=small_model_log_probs)
    plugin = methods.objective(task, "Plugin", "hyper", {})
    rows = []
    for variant in variants:
        model = methods.build_model(task, "Plugin", variant.arch or default, seed)
        rows.append({"label": variant.label, "reweighting model": variant.name,
                     "parameters": count_parameters(model),
                     "loss alone at init": alone.mean_nll(model),
                     "Plugin loss at init": plugin.mean_nll(model)})
    return pd.DataFrame(rows)


def check_single_layer_gain(summary: pd.DataFrame, metrics: Sequence[str] = ("BLEU", "ROUGE-L")) -> str:
    """Paper: "a single-layer reweighting model yields significant improvements over the base".
    Supported when the 1-layer Plugin's mean beats the base alone on every metric given
    (higher means; significance is not tested here)."""
    means = _mean_table(summary)
    gain = means.loc[ONE_LAYER, list(metrics)] - means.loc["Zeroshot", list(metrics)]
    return _verdict(bool((gain > 0).all()), "1-layer Plugin minus base alone: " + _numbers(gain) + ".")


def check_more_layers(summary: pd.DataFrame, metrics: Sequence[str] = ("BLEU", "ROUGE-L")) -> str:
    """Paper: more layers give "diminishing returns and slight performance decline"; "a
    single-layer reweighting model yields optimal performance". Supported when no deeper model
    (label ``Plugin-<k>L``) beats the 1-layer one on any metric given."""
    means = _mean_table(summary)
    rows = means.loc[means.index.str.fullmatch(r"Plugin-\d+L"), list(metrics)]
    if rows.empty:
        return "Not checkable: no reweighting model with more than one layer was run."
    best = rows.idxmax()
    ahead = [m for m in metrics if rows.loc[best[m], m] > means.loc[ONE_LAYER, m]]
    details = "; ".join(f"{m}: 1 layer {means.loc[ONE_LAYER, m]:.4f}, best deeper {best[m]} {rows.loc[best[m], m]:.4f}"
                        for m in metrics)
    return _verdict(not ahead, f"{details}.")


def check_pretrained(summary: pd.DataFrame, metrics: Sequence[str] = ("BLEU", "ROUGE-L")) -> str:
    """Paper: "initializing with a pretrained GPT2-Small substantially improves performance".
    Supported when the pretrained reweighting model beats the 1-layer one on every metric given."""
    means = _mean_table(summary)
    gain = means.loc["Plugin-pretrained", list(metrics)] - means.loc[ONE_LAYER, list(metrics)]
    return _verdict(bool((gain > 0).all()), "pretrained minus 1-layer random init: " + _numbers(gain) + ".")


def check_architecture(summary: pd.DataFrame, metrics: Sequence[str] = METRIC_NAMES) -> str:
    """Paper: the transformer layer "consistently outperforms both the MLP and linear layers
    across all metrics". Supported when its mean is the highest on every metric."""
    means = _mean_table(summary).drop(index="Zeroshot", errors="ignore")
    best = means[list(metrics)].idxmax()
    losing = {m: best[m] for m in metrics if best[m] != ONE_LAYER}
    text = (f"the transformer layer has the highest mean on {len(metrics) - len(losing)}/{len(metrics)} metrics"
            + (" (best elsewhere: " + ", ".join(f"{m} {v}" for m, v in losing.items()) + ")" if losing else "")
            + "; means per model: "
            + "; ".join(f"{label}: " + _numbers(means.loc[label, list(metrics)]) for label in means.index) + ".")
    return _verdict(not losing, text)


def check_architecture_spread(summary: pd.DataFrame, metrics: Sequence[str] = METRIC_NAMES) -> str:
    """Paper: the transformer layer has "narrower standard deviation bands". Supported when its
    std over seeds is the smallest on most metrics; not checkable with one seed."""
    means = _mean_table(summary).drop(index="Zeroshot", errors="ignore")
    stds = means[[f"{m}_std" for m in metrics]]
    if stds.isna().any().any():
        return "Not checkable: the standard deviation needs two or more seeds."
    narrowest = [m for m in metrics if stds[f"{m}_std"].idxmin() == ONE_LAYER]
    return _verdict(len(narrowest) > len(metrics) / 2,
                    f"the transformer layer has the narrowest std over seeds on {len(narrowest)}/{len(metrics)} "
                    f"metrics ({', '.join(narrowest) or 'none'}).")


def plot_complexity(summary: pd.DataFrame, variants: Sequence[Variant],
                    metrics: Sequence[str] = ("BLEU", "ROUGE-L")) -> plt.Figure:
    """Bars per reweighting model (std over seeds as error bars); dashed: the base alone."""
    means = _mean_table(summary)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(5.5, 1.1 * len(variants)) * len(metrics), 4.2))
    x = np.arange(len(variants))
    colors = ["C0" if v.arch is None or v.arch.get("arch") != "pretrained" else "C2" for v in variants]
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        rows = means.loc[[v.label for v in variants]]
        ax.bar(x, rows[metric], yerr=rows[f"{metric}_std"].fillna(0.0), color=colors, capsize=3)
        ax.axhline(means.loc["Zeroshot", metric], ls="--", color="black", label="base alone (Zeroshot)")
        ax.set_xticks(x, [textwrap.fill(v.name, 12) for v in variants])
        ax.set_title(metric)
        ax.legend(loc="lower right")
    fig.supxlabel("reweighting model")
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_architecture(summary: pd.DataFrame, variants: Sequence[Variant]) -> plt.Figure:
    """Mean per metric with a mean ± std band per reweighting architecture; 0-1 metrics on the
    left, CIDEr and NIST (other scales) on the right."""
    means = _mean_table(summary)
    groups = (("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR"), ("CIDEr", "NIST"))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [5, 2.2]})
    for ax, metrics in zip(axes, groups):
        x = np.arange(len(metrics))
        for variant in variants:
            mean = means.loc[variant.label, list(metrics)].to_numpy(float)
            std = np.nan_to_num(means.loc[variant.label, [f"{m}_std" for m in metrics]].to_numpy(float))
            ax.plot(x, mean, marker="o", label=variant.name)
            ax.fill_between(x, mean - std, mean + std, alpha=0.25)
        ax.set_xticks(x, metrics)
    axes[0].set_title("mean over seeds, band: ± std")
    axes[1].set_title("CIDEr-D and NIST (other scales)")
    axes[0].legend()
    fig.tight_layout()
    plt.close(fig)
    return fig
