"""Notebook 15: the Plugin against proxy-tuning and DExperts (issue 60), exploratory.

The question: does training the small model *through* the base (the Plugin) beat training it
alone and multiplying it in at decoding time (proxy-tuning)? Every arm shares the task's
training pairs, splits, prompts, decoding settings and selection rule (``harness.methods``):

- Zeroshot: the base alone;
- NewModel: the small model trained alone, decoded alone (the expert of the next two);
- ProxyTuning: softmax(b + alpha * (e - a)) with NewModel's model as the expert e and a uniform
  anti-expert a (at CPU scale; the paper profiles' pretrained experts are not run yet);
- DExperts: the same after cutting b to its top-p nucleus (DExperts' filter_p);
- Plugin: the same small model trained through the product b * r. It starts from the very
  weights the expert started from (one architecture, one seed), so the two differ only in
  whether training went through the base.

With the profile's ``proxy.pretrained`` the same comparison runs again from a pretrained small
model (``harness.baselines.variants.expert_variant``; at CPU scale the base cut to a few blocks, a weaker
stand-in): NewModel-pretrained tunes it alone; ProxyTuning-pretrained and DExperts-pretrained add
its difference from itself untuned (proxy-tuning's own expert and anti-expert); Plugin-pretrained
trains it through the base. Their hyperparameters follow notebook 07's rule for its pretrained
model (``ablations.complexity_hparams``): a search each, or the 1-layer Plugin's choice for all
four alike. Plugin-pretrained is then one run, shared by both notebooks.

``cost_table`` puts their costs side by side: trainable parameters, model forwards per
generated token, what training asks of the base (the Plugin: its outputs on every training and
hyper-validation token; the proxy arms: on the hyper-validation tokens only, to choose alpha),
and decoding seconds per generated token measured here (seeded untrained models of the runs'
shapes: decoding costs the same).
"""
from __future__ import annotations

import functools
import time

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import data
from ..core.blackbox import BlackBoxLM
from ..core.combine import proxy_combine
from ..core.decode import generate
from ..core.reweighter import make_reweighter
from ..harness import grid, methods, tasks
from ..harness.running import runner, search
from ..harness.profile import Profile, ablation_settings, load_profile
from ..harness.baselines.variants import expert_variant
from ..report import tables, writer

ARMS = ("Zeroshot", "NewModel", "ProxyTuning", "DExperts", "Plugin")
PRETRAINED = "-pretrained"  # the label suffix of the arms from a pretrained small model
PRETRAINED_ARMS = ("NewModel", "ProxyTuning", "DExperts", "Plugin")
# Model forwards per generated token: base, small model (an anti-expert other than uniform adds one).
FORWARDS = {"Zeroshot": (1, 0), "NewModel": (0, 1), "ProxyTuning": (1, 1), "DExperts": (1, 1), "Plugin": (1, 1)}


def notebook_datasets(datasets: str | list[str] | None = None) -> list[str]:
    """The datasets given (one name or a list); by default all four, as the main tables."""
    return [datasets] if isinstance(datasets, str) else list(datasets or data.DATASETS)


def pretrained_jobs(model_name: str, profile: Profile) -> list[tuple]:
    """The ``-pretrained`` arms' runs on one base, as (method, seed, label, arch, narrow); none
    unless the profile's ``proxy.pretrained``."""
    if not profile.proxy.pretrained:
        return []
    setup = ablation_settings(profile)
    arch = expert_variant(model_name, setup.pretrained_layers).arch
    narrow = setup.complexity_hparams == "one-layer"  # notebook 07's rule: one Plugin-pretrained run
    return [(method, seed, method + PRETRAINED, arch, narrow) for method in PRETRAINED_ARMS for seed in profile.seeds]


def run_proxy(datasets: list[str], profile: Profile, *, model_names: list[str] | None = None) -> list[dict]:
    """Every arm's runs per dataset; Zeroshot, NewModel and Plugin are the main tables' runs."""
    for dataset in datasets:  # every argument checked before the first run is written
        runner.check_run_arguments(dataset, model_names=model_names, method_names=list(ARMS))
    records = []
    for dataset in datasets:
        for model_name, jobs in runner.table_jobs(profile, model_names, list(ARMS)).items():
            task = runner.load_task(model_name, dataset, profile)
            records += [runner.run_experiment(task, method, seed, profile, progress=False)
                        for method, seed in tqdm(jobs, desc=f"{dataset} / {model_name}")]
            narrowed = None
            for method, seed, label, arch, narrow in pretrained_jobs(model_name, profile):
                if narrow:
                    narrowed = narrowed or search.narrowed_profile(task, profile, "Plugin")
                records.append(runner.run_experiment(task, method, seed, narrowed if narrow else profile, arch=arch,
                                                     label=label, progress=False))
    return records


def units(profile: Profile, notebook: str, *, datasets: str | list[str] | None, models: list[str] | None,
          seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of :func:`run_proxy` with the notebook's parameters."""
    profile, model_names = load_profile(profile, seeds=seeds), models
    units = []
    for dataset in notebook_datasets(datasets):
        units += grid.table_units(dataset, profile, notebook, model_names=model_names, method_names=list(ARMS))
        for model_name in model_names or profile.base_models:
            units += grid.task_units(grid.TaskRef(model_name, dataset), profile, pretrained_jobs(model_name, profile),
                                     notebook)
    return grid.merge(units)


def scores(records: list[dict], profile: Profile) -> dict[str, pd.DataFrame]:
    """Per dataset, mean ± std over seeds of every arm (saved as ``proxy_<dataset>``)."""
    shown = {}
    for dataset in dict.fromkeys(r["dataset"] for r in records):
        chosen = [r for r in records if r["dataset"] == dataset]
        summary = tables.summarize(tables.runs_frame(chosen))
        caption = tables.caption(chosen, f"{dataset}: the Plugin against proxy-tuning and DExperts (alpha chosen "
                                         "on hyper-validation; anti-expert uniform, or for the -pretrained arms "
                                         "the pretrained model untuned).")
        tables.save_results_table(summary, f"proxy_{dataset}", profile, caption)
        shown[dataset] = tables.format_table(summary)
    return shown


def chosen_alphas(records: list[dict]) -> pd.DataFrame:
    """The alpha each proxy run chose, with its hyper-validation loss per alpha and the base's
    alone (alpha 0): an expert that lowers no loss below the base's has not helped it."""
    rows = [{"dataset": r["dataset"], "model": r["model"], "method": r["method"], "seed": r["seed"],
             "alpha": r["hparams"]["alpha"],
             **{("base alone" if a == "0" else f"loss at {a}"): v for a, v in r["training"]["alpha_hyper_losses"].items()}}
            for r in records if r["method"].removesuffix(PRETRAINED) in methods.PROXY_ARMS]
    return pd.DataFrame(rows)


def figure(records: list[dict], metric: str = "BLEU"):
    """``metric`` per arm and dataset, mean over seeds with their standard deviation."""
    frame = pd.concat([tables.runs_frame([r]).assign(dataset=r["dataset"]) for r in records], ignore_index=True)
    return writer.metric_bars(frame.assign(model=frame["dataset"] + " / " + frame["model"]), metrics=(metric,),
                              title=f"{metric}: the Plugin against proxy-tuning and DExperts")


@torch.no_grad()
def cost_table(task: tasks.Task, profile: Profile, *, prompts: int = 8, new_tokens: int = 16) -> pd.DataFrame:
    """Each arm's cost on ``task``: trainable parameters, forwards per generated token, the base's
    training-time work (pairs and tokens it must score), and decoding seconds per generated token
    (``prompts`` test prompts, exactly ``new_tokens`` each, batched, on this machine). With the
    profile's ``proxy.pretrained``, the ``-pretrained`` arms too (their anti-expert is one more
    small-model forward per token)."""
    small = {"": search.arch_for(task.base.name)}
    if profile.proxy.pretrained:
        small[PRETRAINED] = expert_variant(task.base.name, ablation_settings(profile).pretrained_layers).arch
    texts = [task.prompt(ex) for ex in task.test[:prompts]]
    settings = dict(batch_size=len(texts), max_new_tokens=new_tokens, min_new_tokens=new_tokens, progress=False,
                    repetition_penalty=profile.decoding.repetition_penalty, max_prompt_tokens=task.max_prompt_tokens)
    train, hyper = task.encoded("train"), task.encoded("hyper")
    rows = []
    for suffix, arch in small.items():
        model = make_reweighter(vocab_size=task.base.vocab_size, seed=0, **arch).to(task.base.device).eval()
        parameters = sum(p.numel() for p in model.parameters())
        paired = methods.proxy_expert(task, model, arch, 0)  # the pretrained arms' expert and anti-expert
        for arm in ARMS if not suffix else PRETRAINED_ARMS:
            combine = {"ProxyTuning": dict(combine=functools.partial(proxy_combine, alpha=1.0)),
                       "DExperts": dict(combine=functools.partial(proxy_combine, alpha=1.0, top_p=profile.proxy.top_p))
                       }.get(arm, {})
            base = BlackBoxLM(model, task.base.tokenizer, "NewModel") if arm == "NewModel" else task.base
            added = {"ProxyTuning": paired, "DExperts": paired, "Plugin": model}.get(arm)
            generate(base, texts[:1], added, **{**settings, "batch_size": 1}, **combine)  # warm-up
            started = time.perf_counter()
            generate(base, texts, added, **settings, **combine)
            seconds = time.perf_counter() - started
            scored = {"Plugin": train + hyper, "ProxyTuning": hyper, "DExperts": hyper}.get(arm, [])
            small_forwards = FORWARDS[arm][1] + (added is paired and paired is not model)
            rows.append({"arm": arm + suffix, "trainable parameters": 0 if arm == "Zeroshot" else parameters,
                         "base forwards / token": FORWARDS[arm][0], "small-model forwards / token": small_forwards,
                         "base-scored pairs at training": len(scored),
                         "base-scored tokens at training": sum(len(p.input_ids) for p in scored),
                         "decoding ms / token (this machine)": 1000 * seconds / (len(texts) * new_tokens)})
    return pd.DataFrame(rows)
