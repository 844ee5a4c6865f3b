"""Notebook 11: the Plugin next to LoRA (paper Table 8), and their decoding FLOPs.

LoRA (``methods`` method "LoRA") runs through ``runner.run_table`` like every other method, so
Zeroshot and Plugin come from (or become) the main tables' runs. FLOPs of decoding 64 tokens
and trainable parameters come from ``harness.flops`` on the offline base (meta-device copies:
no weights needed) and on GPT2-XL's published shape. The paper's numbers:
``plugin_lib/paper/table8.csv`` and ``table8_flops.csv``.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from .. import paper as published
from ..core.reweighter import count_parameters, make_reweighter
from ..harness import flops, grid, models, tasks
from ..harness.running import runner, search
from ..harness.baselines.lora import add_lora
from ..harness.profile import Profile, load_profile
from ..metrics import METRIC_NAMES
from ..report import verdicts
from ..report.claims import n_seeds, record_claim
from ..report.comparison import MINIMAL_GAP, describe_counts, minimal_gaps, table_models

TABLE8_METHODS = ("Zeroshot", "LoRA", "Plugin")


def paper_rows() -> pd.DataFrame:
    """The paper's Table 8."""
    return published.table("table8")


def run_table8(datasets: list[str], profile: Profile, *, model_names: list[str] | None = None) -> list[dict]:
    """Zeroshot, LoRA and Plugin runs per dataset; Zeroshot and Plugin are the main tables' runs."""
    model_names = model_names or table_models(profile, paper_rows())
    for dataset in datasets:  # every argument checked before the first run is written
        runner.check_run_arguments(dataset, model_names=model_names)
    return [r for d in datasets for r in runner.run_table(d, profile, model_names=model_names, method_names=list(TABLE8_METHODS))]


def units(profile: Profile, notebook: str, *, datasets: str | list[str] | None, models: list[str] | None,
          seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of :func:`run_table8` with the notebook's parameters."""
    profile = load_profile(profile, seeds=seeds)
    model_names = models or table_models(profile, paper_rows())
    return [u for d in runner.notebook_datasets(profile, datasets)
            for u in grid.table_units(d, profile, notebook, model_names=model_names, method_names=list(TABLE8_METHODS))]


def _meta_model(model_name: str) -> torch.nn.Module:
    """The base's architecture on the meta device: FLOPs without loading any weights."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(models.model_config(model_name))


def offline_flops(task: tasks.Task, *, new_tokens: int = 64, lora_rank: int = 8) -> dict:
    """Plugin vs LoRA on the task's base: FLOPs of decoding ``new_tokens`` tokens after a prompt
    of the mean test-prompt length, and trainable parameters.

    Plugin = the base + the reweighting architecture of the Plugin runs (``search.arch_for``);
    LoRA = the base with rank-``lora_rank`` adapters (``lora.add_lora``), counted unmerged.
    """
    base = _meta_model(task.base.name)
    with torch.device("meta"):
        reweighter = make_reweighter(vocab_size=base.get_output_embeddings().weight.shape[0],
                                     **search.arch_for(task.base.name))
    lora_model = add_lora(_meta_model(task.base.name), r=lora_rank)
    prompt_length = round(np.mean([len(ids) for ids in task.base.tokenizer(
        [task.prompt(ex) for ex in task.test])["input_ids"]]))
    kwargs = {"prompt_length": prompt_length, "new_tokens": new_tokens}
    plugin = flops.generation_flops(base, reweighter, **kwargs)
    return {
        "model": models.model_spec(task.base.name)["display"],
        **kwargs,
        "base_flops": plugin.base,
        "reweighter_flops": plugin.reweighter,
        "plugin_flops": plugin.total,
        "lora_flops": flops.generation_flops(lora_model, **kwargs).total,
        "plugin_params": count_parameters(reweighter),
        "lora_params": count_parameters(lora_model),
    }


def flops_table(offline: dict, gpt2_xl: dict) -> pd.DataFrame:
    """Plugin vs LoRA: GFLOPs of decoding and trainable parameters (millions), ours and the paper's."""

    def row(name, values, prefix=""):
        plugin, lora = values[f"{prefix}plugin_flops"], values[f"{prefix}lora_flops"]
        return {"setting": name, "Plugin GFLOPs": plugin / 1e9, "LoRA GFLOPs": lora / 1e9,
                "Plugin / LoRA": plugin / lora, "Plugin params (M)": values[f"{prefix}plugin_params"] / 1e6,
                "LoRA params (M)": values[f"{prefix}lora_params"] / 1e6}

    return pd.DataFrame([
        row(f"{offline['model']}, prompt {offline['prompt_length']} tokens (ours)", offline),
        row(f"GPT2-XL shape, prompt {gpt2_xl['prompt_length']} token (ours)", gpt2_xl),
        row("GPT2-XL (paper)", gpt2_xl, prefix="paper_"),
    ]).set_index("setting").round(3)


def gpt2_xl_breakdown(gpt2_xl: dict) -> pd.DataFrame:
    """Where GPT2-XL's decoding FLOPs and the trainable parameters go, next to the paper's totals."""
    g = 1e9
    parts = [
        ("base: blocks' linear layers", gpt2_xl["base_block_linear_flops"] / g, "GFLOPs"),
        ("base: output head (1600 x 50257)", gpt2_xl["base_head_flops"] / g, "GFLOPs"),
        ("base: attention scores and values", gpt2_xl["base_attention_flops"] / g, "GFLOPs"),
        ("LoRA adapters (unmerged)", (gpt2_xl["lora_flops"] - gpt2_xl["base_flops"]) / g, "GFLOPs"),
        ("Plugin reweighter (1-layer GPT-2, 768 wide)", gpt2_xl["reweighter_flops"] / g, "GFLOPs"),
        ("paper: LoRA total", gpt2_xl["paper_lora_flops"] / g, "GFLOPs"),
        ("paper: Plugin total", gpt2_xl["paper_plugin_flops"] / g, "GFLOPs"),
        ("paper: Plugin - LoRA", (gpt2_xl["paper_plugin_flops"] - gpt2_xl["paper_lora_flops"]) / g, "GFLOPs"),
        ("Plugin reweighter parameters", gpt2_xl["plugin_params"] / 1e6, "M"),
        ("  of which its transformer block", gpt2_xl["plugin_block_params"] / 1e6, "M"),
        ("one GPT2-XL block", gpt2_xl["gpt2_xl_block_params"] / 1e6, "M"),
        ("LoRA parameters", gpt2_xl["lora_params"] / 1e6, "M"),
        ("paper: Plugin parameters", gpt2_xl["paper_plugin_params"] / 1e6, "M"),
        ("paper: LoRA parameters", gpt2_xl["paper_lora_params"] / 1e6, "M"),
    ]
    return pd.DataFrame(parts, columns=["part", "value", "unit"]).round({"value": 3})


# Table 8: "less than 5% apart" in FLOPs (196.2B vs 188.8B), compared exactly on the counts.
FLOPS_MARGIN = Fraction(105, 100)

GAP_RULE = (
    f"An equivalence rule, on means over seeds: per (dataset, base model), the Plugin is within {MINIMAL_GAP:.0%} of "
    "LoRA's value (|Plugin - LoRA| <= 10% of |LoRA|) on most of the seven metrics; reproduced if that holds for "
    "most (dataset, base model) pairs, else not reproduced. No significance test: a test that fails to find a "
    "difference would not show that there is none."
)
FLOPS_RULE = (
    f"Exact count: the Plugin's decoding FLOPs over LoRA's (GPT2-XL shape, 64 new tokens, torch's FLOP counter) "
    f"below {float(FLOPS_MARGIN):.2f}, compared as a ratio of integers; reproduced or not reproduced (a count "
    "has no sampling error)."
)


def record_claims(profile: Profile | str, frame: pd.DataFrame, records: list[dict], offline: dict,
                  gpt2_xl: dict) -> list[dict]:
    """Table 8: Plugin within MINIMAL_GAP of LoRA on most metrics (``GAP_RULE``); Plugin under
    5% more FLOPs (``FLOPS_RULE``). ``frame``: ``comparison.comparison`` of ``records``;
    ``offline``, ``gpt2_xl``: ``offline_flops`` and ``flops.gpt2_xl_comparison``."""
    ours_counts = minimal_gaps(frame)
    gaps = {}
    for dataset, model in ours_counts.index:
        rows = frame[(frame.dataset == dataset) & (frame.model == model)].set_index("method")
        gaps[f"{dataset} ({model})"] = {m: float(abs(rows.at["Plugin", m] - rows.at["LoRA", m]) / abs(rows.at["LoRA", m]))
                                        for m in METRIC_NAMES}
    plugin_runs = [r for r in records if r["method"] == "Plugin"]
    n = {"inputs": len(plugin_runs[0]["test_ids"]) if plugin_runs else None,
         "seeds": len({r["seed"] for r in plugin_runs}) or None}
    if ours_counts.empty:
        gap_verdict = verdicts.NOT_MEASURABLE
    else:
        within = int(sum(verdicts.most(c, len(METRIC_NAMES)) for c in ours_counts))
        gap_verdict = verdicts.REPRODUCED if verdicts.most(within, len(ours_counts)) else verdicts.NOT_REPRODUCED
    gap = record_claim(
        profile, "table8_lora_gap",
        f"Plugin and LoRA differ minimally (within {MINIMAL_GAP:.0%} of LoRA's value) on most metrics",
        describe_counts(minimal_gaps(paper_rows())), describe_counts(ours_counts), gap_verdict, rule=GAP_RULE,
        statistic={"summary": "; ".join(f"{name}: within {MINIMAL_GAP:.0%} on {count}/{len(METRIC_NAMES)}, "
                                        f"BLEU gap {g['BLEU']:.1%}" for count, (name, g) in zip(ours_counts, gaps.items()))
                              + f"; {n['inputs']} inputs, {n_seeds(n['seeds'])}",
                   "n": n, "relative gap to LoRA (means)": gaps})
    ratio = Fraction(gpt2_xl["plugin_flops"]) / Fraction(gpt2_xl["lora_flops"])
    offline_ratio = Fraction(offline["plugin_flops"]) / Fraction(offline["lora_flops"])
    paper_ratio = gpt2_xl["paper_plugin_flops"] / gpt2_xl["paper_lora_flops"]
    flops_claim = record_claim(
        profile, "table8_flops", f"Plugin needs less than {float(FLOPS_MARGIN) - 1:.0%} more decoding FLOPs than LoRA",
        f"ratio {paper_ratio:.3f} (GPT2-XL, 64 steps)",
        f"{offline['model']}, prompt {offline['prompt_length']} tokens: ratio {float(offline_ratio):.3f}; GPT2-XL shape, "
        f"prompt {gpt2_xl['prompt_length']} token: ratio {float(ratio):.3f}",
        verdicts.REPRODUCED if ratio < FLOPS_MARGIN else verdicts.NOT_REPRODUCED, rule=FLOPS_RULE,
        statistic={"summary": f"GPT2-XL shape: {gpt2_xl['plugin_flops'] / 1e9:.1f} / {gpt2_xl['lora_flops'] / 1e9:.1f} "
                              f"GFLOPs = {float(ratio):.4f} (exact count)",
                   "n": {"inputs": None, "seeds": None, "new tokens": gpt2_xl["new_tokens"]},
                   "GPT2-XL shape": {"plugin_flops": gpt2_xl["plugin_flops"], "lora_flops": gpt2_xl["lora_flops"],
                                     "ratio": float(ratio)},
                   offline["model"]: {"plugin_flops": offline["plugin_flops"], "lora_flops": offline["lora_flops"],
                                      "ratio": float(offline_ratio)}})
    return [gap, flops_claim]
