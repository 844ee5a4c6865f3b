"""Notebook 05: the Plugin as a wrapper of a prompt-learning method (paper Table 5).

BDPL and BDPL + Plugin, per (dataset, base model, seed):

1. BDPL (``harness.baselines.bdpl``, following Diao et al.'s ``run_glue_discrete_LM.py``; settings
   ``wrapper.bdpl`` of the profile) learns a discrete prefix on the task's training part with
   a budget of black-box calls (75, as in the paper), and chooses the final prefix on
   hyper-validation among the argmax prompt after each update and the empty prefix. The
   prompt, the calls used, the reward of every call and the hyper-validation scores are
   stored in ``runs/<dataset>/<model>/bdpl-prompts/seed<k>.json`` and reused, never learned
   twice (outside the ``*-seed*.json`` pattern of run records), as long as its settings and its
   inputs (``run_keys.inputs_fingerprint``: the task's data and base) match.
   ``reward_per_call_figure`` plots the reward of every call.
2. "BDPL" is Zeroshot on the prefixed task (Zeroshot itself when the empty prefix won);
   "BDPL+Plugin" is the Plugin trained and decoded on the prefixed task. Both are ordinary
   runner records (labels "BDPL", "BDPL+Plugin"). The base-output cache of the prefixed task is a different file from the unprefixed one:
   ``BaseOutputCache`` names it by a hash of the token ids, and the prefix changes them.
   BDPL+Plugin's hyperparameters are chosen on the first seed's prompt and reused by the later
   seeds (the same protocol as every method; ``runner.run_experiment(selection=...)``).
3. Prompt length: ``encode_pairs`` keeps a prompt's last ``max_prompt_tokens`` tokens and
   decoding truncates at the same limit, so the prefixed task's limit is raised by the
   prefix's length (``prefixed_task``): a prompt that fitted without the prefix still fits.

The paper's numbers: ``plugin_lib/paper/table5.csv`` (its Table 5; ROUGE-1/2 are hidden
columns in its LaTeX, transcribed anyway), with the GPT2-XL Zeroshot and Plugin rows of its
Tables 1-4.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from tqdm.auto import tqdm

from .. import paper as published
from ..data import prompts
from ..harness.baselines import bdpl
from ..harness.planning import costs
from ..harness import grid, tasks
from ..harness.running import run_keys, run_store, runner, search
from ..harness.planning.preflight_counts import TaskCounts, count_task
from ..harness.profile import Bdpl, Profile, load_profile
from ..report.comparison import claim_from_runs, metric_wins, pairwise_rule, table_models
from ..utils.io import atomic_write_json, read_json, remove_stale_temporaries
from ..utils.provenance import provenance
from ..utils.record_manifest import write_record

TABLE5_METHODS = ("Zeroshot", "Plugin", "BDPL", "BDPL+Plugin")
BDPL_REWARDS = ("loglik", "rougeL")  # harness.baselines.bdpl.train_bdpl
REWARD_LABELS = {"loglik": "log-likelihood per token", "rougeL": "ROUGE-L F1 (rouge_score)"}
# The claims' tests (exploratory: written after the local runs; the preregistered ones are
# ``report.preregistered``): (key, claim, first, second); rule: ``pairwise_rule``.
TABLE5_CLAIMS = (
    ("table5_bdpl_plugin", "BDPL + Plugin beats BDPL on most metrics", "BDPL+Plugin", "BDPL"),
    ("table5_plugin_vs_bdpl", "Plugin (main tables) beats BDPL on most metrics", "Plugin", "BDPL"),
    ("table5_bdpl_plugin_vs_plugin", "BDPL + Plugin beats the Plugin alone (main tables) on most metrics",
     "BDPL+Plugin", "Plugin"),
)
TABLE5_RULES = {key: pairwise_rule(first, second) for key, _, first, second in TABLE5_CLAIMS}


def paper_rows() -> pd.DataFrame:
    """The paper's Table 5, with the GPT2-XL Zeroshot and Plugin rows of its Tables 1-4."""
    main = published.main_results()
    main = main[(main.model == "GPT2-XL") & main.method.isin(["Zeroshot", "Plugin"])]
    return pd.concat([main, published.table("table5")], ignore_index=True)


def notebook_budget(profile: Profile, budget: int | None = None) -> int:
    """The BDPL budget given; by default the profile's ``wrapper.bdpl_budget``."""
    budget = budget if budget is not None else profile.wrapper.bdpl_budget
    check_bdpl_arguments(budget, "loglik")
    return budget


def check_bdpl_arguments(budget, reward) -> None:
    """TypeError/ValueError for a budget that is not a positive integer or an unknown reward."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise TypeError(f"The BDPL budget must be a positive integer (black-box calls), got {budget!r}.")
    if reward not in BDPL_REWARDS:
        raise ValueError(f"Unknown BDPL reward {reward!r}; choose one of {list(BDPL_REWARDS)}.")


# ---------------------------------------------------------------- BDPL prompts


def _prompt_settings(task: tasks.Task, seed: int, budget: int, reward: str, settings: Bdpl) -> str:
    """Everything a learned prompt depends on; a prompt learned under other settings is relearned."""
    relevant = {"dataset": task.dataset, "model": task.base.name, "family": task.family,
                "chat_template": task.use_chat_template, "train_ids": [ex.id for ex in task.train],
                "hyper_ids": [ex.id for ex in task.hyper], "seed": seed, "budget": budget, "reward": reward,
                "bdpl": dataclasses.asdict(settings)}
    if task.prompt_style != "appendix":  # as in run_keys.settings_fingerprint: appendix-era prompts stay current
        relevant["prompts"] = task.prompt_style
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def stored_prompt(task: tasks.Task, profile: Profile, seed: int, *, budget: int = bdpl.DEFAULT_BUDGET,
                  reward: str = "loglik") -> dict | None:
    """The current record of :func:`learn_prompt`, or None (none stored, or a stale one)."""
    path = bdpl.prompt_path(profile, task.dataset, task.base.name, seed, budget)
    if not path.exists():
        return None
    stored = read_json(path)
    fingerprint = _prompt_settings(task, seed, budget, reward, profile.wrapper.bdpl)
    return stored if run_keys.is_current(stored, fingerprint, run_keys.inputs_fingerprint(task)) else None


def learn_prompt(task: tasks.Task, profile: Profile, seed: int, *, budget: int = bdpl.DEFAULT_BUDGET,
                 reward: str = "loglik", progress: bool = False) -> dict:
    """BDPL's prefix for ``task`` and ``seed``: learned on the training part and chosen on
    hyper-validation (``bdpl.train_bdpl``, settings ``profile.wrapper.bdpl``) once, then read back.

    The record keeps the reward of every call (``reward_per_call``), each step's samples,
    argmax prompt and largest probability per position (``history``), the final
    probabilities, and the hyper-validation reward of every final candidate, the empty
    prefix among them (``selection``; ``selection_calls`` black-box calls, outside the budget).

    One process learns it (the others wait and read the record). Its work so far is kept after
    every step in a checkpoint beside the record (``checkpoint_path``), so that an interrupted
    search (thousands of calls: hours on a CPU) goes on where it stopped, to the same prompt.
    """
    if task.prompt_prefix:
        raise ValueError("BDPL learns a prefix for an unprefixed task.")
    stored = stored_prompt(task, profile, seed, budget=budget, reward=reward)
    if stored is not None:
        return stored
    path = bdpl.prompt_path(profile, task.dataset, task.base.name, seed, budget)
    with run_store.unit_lock(path.parent, path.stem):
        remove_stale_temporaries(path.parent)
        stored = stored_prompt(task, profile, seed, budget=budget, reward=reward)
        if stored is not None:  # learned meanwhile, or killed between the record and the checkpoint's removal
            checkpoint_path(path).unlink(missing_ok=True)
            return stored
        return _learn_prompt(task, profile, seed, budget, reward, path, progress)


def checkpoint_path(prompt_path: Path) -> Path:
    """Where a prompt's unfinished search is kept: ``.<record name>.partial`` beside it (not a
    ``*.json``, so nothing that reads records takes it for one)."""
    return prompt_path.with_name(f".{prompt_path.name}.partial")


def _learn_prompt(task: tasks.Task, profile: Profile, seed: int, budget: int, reward: str, path: Path,
                  progress: bool) -> dict:
    settings = profile.wrapper.bdpl
    fingerprint = _prompt_settings(task, seed, budget, reward, settings)
    inputs = run_keys.inputs_fingerprint(task)
    partial = checkpoint_path(path)
    saved = read_json(partial) if partial.exists() else None
    if saved is not None and (saved.get("settings"), saved.get("inputs")) != (fingerprint, inputs):
        saved = None  # made under other settings or from other data: start again
    spent = saved["seconds"] if saved is not None else 0.0
    started = time.perf_counter()

    def save_checkpoint(state: dict) -> None:
        atomic_write_json(partial, {"settings": fingerprint, "inputs": inputs, "state": state,
                                    "seconds": spent + time.perf_counter() - started})

    result = bdpl.train_bdpl(
        task.base,
        task.train,
        task.hyper,
        lambda ex: prompts.build_prompt(task.dataset, task.family, ex.source, style=task.prompt_style),
        settings,
        budget=budget,
        seed=seed,
        reward=reward,
        # The chat template wraps prefix + task prompt, exactly as Task.prompt does.
        format_prompt=functools.partial(prompts.format_for_model, tokenizer=task.base.tokenizer,
                                        use_chat_template=task.use_chat_template),
        checkpoint=saved["state"] if saved is not None else None,
        save_checkpoint=save_checkpoint,
        progress=progress,
    )
    trajectory = result.trajectory
    hyper_rewards = {row["origin"]: row["hyper_reward"] for row in result.selection}
    record = {
        "dataset": task.dataset, "model": task.base.name, "seed": seed, "settings": fingerprint, "inputs": inputs,
        "prefix": result.prefix, "origin": result.origin, "budget": budget, "calls_used": trajectory.calls_used,
        "reward": reward, "bdpl": dataclasses.asdict(settings),
        "hyper_reward": max(hyper_rewards.values()), "hyper_reward_no_prefix": hyper_rewards[bdpl.NO_PREFIX],
        "selection": result.selection, "selection_calls": result.selection_calls,
        "reward_per_call": trajectory.rewards_per_call, "mean_rewards": trajectory.mean_rewards,
        "history": trajectory.history, "candidates": list(trajectory.candidates), "probs": trajectory.probs.tolist(),
        "top_probs": bdpl.sampling_probs(trajectory.probs).max(axis=1).tolist(), "train_inputs": len(task.train),
        "hyper_inputs": len(task.hyper), "seconds": spent + time.perf_counter() - started,
        "provenance": provenance(task.base.device),
    }
    write_record(path, record)  # its hash goes into the store's manifest (utils.record_manifest)
    partial.unlink(missing_ok=True)
    return read_json(path)  # as stored (lists, not tuples), the same as a later read


def prefix_tokens(tokenizer, prefix: str) -> int:
    """Tokens the prefix adds to a prompt: its own, plus one for the joining space."""
    return len(tokenizer(prefix, add_special_tokens=False)["input_ids"]) + 1


def prefixed_task(task: tasks.Task, prefix: str) -> tasks.Task:
    """``task`` with ``prefix`` before every prompt, its token limit raised by the prefix's length.

    A new Task object, so its encoded pairs and base-output caches are its own.
    """
    extra = prefix_tokens(task.base.tokenizer, prefix) if prefix else 0
    return dataclasses.replace(task, prompt_prefix=prefix, max_prompt_tokens=task.max_prompt_tokens + extra)


def prompt_lengths(task: tasks.Task) -> dict:
    """Token counts of the task's prompts (training, hyper-validation, test) against its limit."""
    texts = [task.prompt(ex) for ex in task.train + task.hyper + task.test]
    lengths = np.array([len(ids) for ids in task.base.tokenizer(texts)["input_ids"]])
    return {"mean": float(lengths.mean()), "longest": int(lengths.max()), "limit": task.max_prompt_tokens,
            "over_limit": int((lengths > task.max_prompt_tokens).sum()), "prompts": len(lengths)}


def run_bdpl(task: tasks.Task, profile: Profile, seed: int, *, budget: int = bdpl.DEFAULT_BUDGET,
             reward: str = "loglik", progress: bool = False) -> tuple[dict, list[dict]]:
    """The seed's BDPL prompt and its two runs, "BDPL" and "BDPL+Plugin" (stored, resumable)."""
    prompt = learn_prompt(task, profile, seed, budget=budget, reward=reward, progress=progress)
    prefixed = prefixed_task(task, prompt["prefix"])
    first = profile.seeds[0]
    alone, combined = bdpl.run_labels(profile, budget)
    selection = None
    if seed != first:  # hyperparameters chosen on the first seed's prompt, as for every method
        first_prompt = learn_prompt(task, profile, first, budget=budget, reward=reward)
        selection = search.select_hparams(prefixed_task(task, first_prompt["prefix"]), "Plugin", profile,
                                          label=combined, progress=progress)
    runs = [
        runner.run_experiment(prefixed, "Zeroshot", seed, profile, label=alone, progress=progress),
        runner.run_experiment(prefixed, "Plugin", seed, profile, label=combined, selection=selection,
                              progress=progress),
    ]
    return prompt, runs


def learning_budget(task: tasks.Task, profile: Profile, reward: str = "loglik") -> int | None:
    """The smallest of the profile's ``bdpl_learning_budgets`` at which the first seed's BDPL
    learns (``report.preregistered.bdpl_learned``, on hyper-validation only), or None."""
    from ..report.preregistered import bdpl_learned

    for budget in profile.wrapper.bdpl_learning_budgets or ():
        prompt = learn_prompt(task, profile, profile.seeds[0], budget=budget, reward=reward)
        if bdpl_learned([prompt])["per seed"][0]["learned"]:
            return budget
    return None


def run_learning_budget(datasets: list[str], profile: Profile, *, model_names: list[str] | None = None,
                        reward: str = "loglik") -> tuple[int | None, list[dict], pd.DataFrame]:
    """BDPL and BDPL + Plugin at the first budget where BDPL learns (``learning_budget``, per
    dataset and model), beside the paper's 75 calls: (that budget, the runs, the prompts'
    rows). Nothing runs when the profile lists no ``bdpl_learning_budgets``."""
    found, records, rows = None, [], []
    if not profile.wrapper.bdpl_learning_budgets:
        return None, records, pd.DataFrame(rows)
    for model_name in model_names or table_models(profile, paper_rows()):
        for dataset in datasets:
            task = runner.load_task(model_name, dataset, profile)
            found = learning_budget(task, profile, reward)
            if found is None:
                continue
            for seed in tqdm(profile.seeds, desc=f"BDPL at {found} calls, {dataset} / {model_name}"):
                prompt, runs = run_bdpl(task, profile, seed, budget=found, reward=reward)
                records += runs
                rows.append(prompt_row(prompt, task, prefixed_task(task, prompt["prefix"])))
    return found, records, pd.DataFrame(rows)


# ---------------------------------------------------------------- units of the grid (harness.grid)


def bdpl_stored(ref: grid.TaskRef, profile: Profile, seed: int, budget: int, reward: str) -> bool:
    """Whether :func:`run_bdpl` would compute nothing: the prompt and both runs are current."""
    try:
        task = grid.planning_task(ref, profile)
        prompt = stored_prompt(task, profile, seed, budget=budget, reward=reward)
        if prompt is None:
            return False
        prefixed = prefixed_task(task, prompt["prefix"])
        alone, combined = bdpl.run_labels(profile, budget)
        return all(runner.stored_run(prefixed, method, seed, profile, label=label) is not None
                   for method, label in (("Zeroshot", alone), ("Plugin", combined)))
    except (OSError, ValueError):  # no tokenizer here (a Hub base offline): not known to be stored
        return False


def bdpl_unit(ref: grid.TaskRef, profile: Profile, seed: int, budget: int, reward: str) -> None:
    """A grid unit: the seed's prompt and its two runs, on the worker's loaded base."""
    run_bdpl(grid.worker_task(ref, profile), profile, seed, budget=budget, reward=reward)


def learning_stored(ref: grid.TaskRef, profile: Profile, reward: str) -> bool:
    """Whether :func:`run_learning_budget` would compute nothing on this task."""
    from ..report.preregistered import bdpl_learned

    try:
        task = grid.planning_task(ref, profile)
        for budget in profile.wrapper.bdpl_learning_budgets or ():
            prompt = stored_prompt(task, profile, profile.seeds[0], budget=budget, reward=reward)
            if prompt is None:
                return False
            if bdpl_learned([prompt])["per seed"][0]["learned"]:
                return all(bdpl_stored(ref, profile, seed, budget, reward) for seed in profile.seeds)
        return True
    except (OSError, ValueError):
        return False


def learning_unit(ref: grid.TaskRef, profile: Profile, reward: str) -> None:
    """A grid unit: the learning-budget search on one task and the runs at the budget found."""
    task = grid.worker_task(ref, profile)
    found = learning_budget(task, profile, reward)
    for seed in profile.seeds if found is not None else ():
        run_bdpl(task, profile, seed, budget=found, reward=reward)


def units(profile: Profile, notebook: str, *, datasets: str | list[str] | None, models: list[str] | None,
          seeds: list[int] | None, bdpl_budget: int | None, bdpl_reward: str) -> list[grid.Unit]:
    """The grid's units of notebook 05 with its parameters: per (base, dataset) a unit per seed
    (its prompt, its prefixed task's cache, the Plugin's search on the first seed's prompt, the
    two runs; later seeds need the first), and the learning-budget search where the profile lists
    budgets. Zeroshot and Plugin come from the main tables' units."""
    profile = load_profile(profile, seeds=seeds)
    budget, reward = notebook_budget(profile, bdpl_budget), bdpl_reward
    found = []
    for model in models or table_models(profile, paper_rows()):
        for dataset in runner.notebook_datasets(profile, datasets):
            ref = grid.TaskRef(model, dataset)
            counts = count_task(dataset, model, profile)
            folder = grid.folder_key(ref)
            first = None
            for seed in profile.seeds:
                unit = grid.Unit("bdpl", f"{folder}/bdpl-prompts/{bdpl.prompt_path(profile, dataset, model, seed, budget).stem}",
                                 ref, profile, seed=seed, needs=(first,) if first else (), notebooks=(notebook,),
                                 call=functools.partial(bdpl_unit, ref, profile, seed, budget, reward),
                                 done=functools.partial(bdpl_stored, ref, profile, seed, budget, reward),
                                 work=tuple(sorted(_bdpl_work(profile, counts, budget, seed == profile.seeds[0]).items())))
                found.append(unit)
                first = first or unit.key
            if profile.wrapper.bdpl_learning_budgets:
                searched = sum(profile.wrapper.bdpl_learning_budgets)  # every budget tried, at most
                found.append(grid.Unit(
                    "bdpl", f"{folder}/bdpl-prompts/learning-budget", ref, profile, notebooks=(notebook,),
                    call=functools.partial(learning_unit, ref, profile, reward),
                    done=functools.partial(learning_stored, ref, profile, reward),
                    work=tuple(sorted(_bdpl_work(profile, counts, searched, True, seeds=len(profile.seeds)).items()))))
    return found


def _bdpl_work(profile: Profile, counts: TaskCounts, budget: int, search: bool, seeds: int = 1) -> dict:
    """A unit's work, at most: BDPL's calls and final choice, the prefixed task's cache, the
    Plugin's trainings (the whole grid on the first seed) and two decodings (``seeds`` times)."""
    settings = profile.wrapper.bdpl
    updates = sum(size > 1 for size in bdpl.step_sizes(budget, settings.samples_per_step))
    calls = budget * settings.batch_size + (updates + 1) * counts.hyper_pairs
    trainings = costs.grid_size(profile, "Plugin") if search else 1
    steps = -(-counts.test_inputs // profile.decoding.batch_size) * profile.decoding.max_new_tokens
    return {"forward_tokens": seeds * (calls + counts.pairs) * counts.pair_tokens,
            "pair_epochs": seeds * trainings * profile.training.max_epochs * counts.pairs,
            "decode_steps": seeds * steps, "plugin_steps": seeds * steps}


def current_runs(task: tasks.Task, profile: Profile, method_names=("Zeroshot", "Plugin")) -> list[dict]:
    """The main tables' stored runs of ``method_names`` on ``task`` made under the current
    settings from the current inputs (``run_store.load_runs``); nothing is run."""
    fingerprint, inputs = run_keys.settings_fingerprint(task, profile), run_keys.inputs_fingerprint(task)
    return [r for r in run_store.load_runs(profile, task.dataset)
            if r["model"] == task.base.name and r["method"] in method_names and run_keys.is_current(r, fingerprint, inputs)]


def prompt_row(prompt: dict, task: tasks.Task, prefixed: tasks.Task) -> dict:
    """One line of the learned-prompts table: the chosen prefix and where it came from, the
    calls, the largest probability per position, rewards, and the truncation check of both tasks."""
    plain, with_prefix = prompt_lengths(task), prompt_lengths(prefixed)
    return {
        "dataset": prompt["dataset"], "model": prompt["model"], "seed": prompt["seed"], "prefix": prompt["prefix"],
        "chosen": prompt["origin"], "calls": f"{prompt['calls_used']}/{prompt['budget']}",
        "selection calls": prompt["selection_calls"],
        "top probability": f"{min(prompt['top_probs']):.4f}-{max(prompt['top_probs']):.4f}",
        "reward first step": round(prompt["mean_rewards"][0], 4),
        "reward last step": round(prompt["mean_rewards"][-1], 4),
        "hyper reward": round(prompt["hyper_reward"], 4),
        "hyper reward, no prefix": round(prompt["hyper_reward_no_prefix"], 4),
        "longest prompt (tokens)": plain["longest"], "with prefix": with_prefix["longest"],
        "limit": plain["limit"], "limit with prefix": with_prefix["limit"],
        "over limit": plain["over_limit"], "over limit with prefix": with_prefix["over_limit"],
    }


def reward_per_call_figure(learned_prompts: list[dict]):
    """BDPL's reward of every black-box call, one panel per (dataset, model), one colour per
    seed: the calls as points, each step's mean as a line, dotted lines between steps. A step's
    samples share a minibatch; steps differ in theirs, so levels compare within a step."""
    panels = sorted({(p["dataset"], p["model"]) for p in learned_prompts})
    if not panels:
        raise ValueError("No BDPL prompt records to plot.")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 3.8), squeeze=False)
    colours = sns.color_palette()
    for ax, (dataset, model) in zip(axes[0], panels):
        ours = sorted((p for p in learned_prompts if (p["dataset"], p["model"]) == (dataset, model)),
                      key=lambda p: p["seed"])
        for n, prompt in enumerate(ours):
            colour = colours[n % len(colours)]
            calls = np.arange(1, len(prompt["reward_per_call"]) + 1)
            ax.scatter(calls, prompt["reward_per_call"], s=10, color=colour, alpha=0.6, label=f"seed {prompt['seed']}")
            first = 1
            for step in prompt["history"]:
                last = step["calls_used"]
                ax.hlines(np.mean(step["rewards"]), first - 0.5, last + 0.5, color=colour, linewidth=2)
                if n == 0 and last < len(calls):
                    ax.axvline(last + 0.5, color="grey", linestyle=":", linewidth=1)
                first = last + 1
        ax.set_title(f"{dataset} / {model}")
        ax.set_xlabel("black-box call")
        ax.set_ylabel(REWARD_LABELS.get(ours[0]["reward"], ours[0]["reward"]))
        ax.legend(fontsize="small")
    fig.suptitle("BDPL: reward per call (points) and per step (lines)")
    fig.tight_layout()
    plt.close(fig)
    return fig


def run_table5(datasets: list[str], profile: Profile, *, model_names: list[str] | None = None,
               budget: int = bdpl.DEFAULT_BUDGET, reward: str = "loglik"
               ) -> tuple[list[dict], pd.DataFrame, list[dict]]:
    """Every BDPL and BDPL+Plugin run of Table 5, with the main tables' Zeroshot and Plugin
    runs where they exist; the learned prompts, one row per (dataset, model, seed); and the
    prompt records themselves (``learn_prompt``)."""
    for dataset in datasets:
        runner.check_run_arguments(dataset, model_names=model_names)
    check_bdpl_arguments(budget, reward)
    records, rows, learned = [], [], []
    for model_name in model_names or table_models(profile, paper_rows()):
        base = None
        for dataset in datasets:
            task = runner.load_task(base or model_name, dataset, profile)
            base = task.base
            records += current_runs(task, profile)
            for seed in tqdm(profile.seeds, desc=f"BDPL {dataset} / {model_name}"):
                prompt, runs = run_bdpl(task, profile, seed, budget=budget, reward=reward)
                records += runs
                learned.append(prompt)
                rows.append(prompt_row(prompt, task, prefixed_task(task, prompt["prefix"])))
    return records, pd.DataFrame(rows), learned


def record_claims(profile: Profile | str, records: list[dict], n_resamples: int) -> list[dict]:
    """Table 5: the Plugin beats BDPL, and "their combination yields further gains", read both
    ways: BDPL + Plugin beats BDPL, and (the stronger reading, which the paper's GPT2-XL numbers
    also show) BDPL + Plugin beats the Plugin alone. Per dataset, on paired runs of the same seed
    (``TABLE5_RULES``)."""
    paper = paper_rows()
    return [claim_from_runs(profile, key, claim, records, first, second, metric_wins(paper, first, second),
                            n_resamples, TABLE5_RULES[key])
            for key, claim, first, second in TABLE5_CLAIMS]
