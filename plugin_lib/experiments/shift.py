"""Distribution shift (the paper's Section 6.4, notebook 10).

The base is fine-tuned on a biased training split: WebNLG's *infrastructure* categories, or
CommonGen scenes about a *man*. A Plugin is then trained, on top of that fine-tuned base, on
the validation data, which is about *persons* (WebNLG) or both genders (CommonGen). The
paper (LLaMA-3.1-8B, GPT-4o as judge) reports the share of Person-related outputs going from
17.99% (fine-tuned base) to 71.34% (Plugin), and the share of woman-related outputs among
gendered ones from 10.37% to 31.92%. Here the judge is the offline word-list judge of
``plugin_lib.analysis.judge`` (validated on references with known labels); GPT-4o runs too when an
OpenAI key is set.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from .. import data
from .. import paper as published
from ..analysis import judge
from ..harness.baselines import finetune
from ..harness import grid, tasks
from ..harness.running import runner
from ..harness.planning.preflight_counts import count_task
from ..harness.profile import Profile, load_profile
from ..report import verdicts
from ..report.claims import n_seeds, record_claim

SHIFTS = {
    "webnlg": {"judge": judge.person_judge, "question": judge.PAPER_PERSON_QUESTION,
               "what": "Person-related outputs", "target": judge.is_person_related,
               "counted": lambda text: True},
    "commongen": {"judge": judge.woman_judge, "question": judge.PAPER_WOMAN_QUESTION,
                  "what": "woman-related outputs among gendered ones",
                  "target": lambda text: judge.gender_of(text) in ("woman", "both"),
                  "counted": lambda text: judge.gender_of(text) is not None},
}

SHIFT_RULE = (
    "Per test input, the judged output is a target (WebNLG: Person-related; CommonGen: woman-related, a woman "
    "word, mixed texts included) or not. Premise: the fine-tuned base is biased away from the target relative "
    "to the original base: its judged share (CommonGen: among gendered outputs) is lower, and an exact McNemar "
    "test of the target outputs, paired by test input (Fisher's exact test of the two shares when the runs are "
    f"not on the same inputs), gives p < {verdicts.ALPHA} with fewer targets from the fine-tuned base; "
    "otherwise not measurable at this scale, with the measured shares. Then, per seed, an exact McNemar test of "
    "the Plugin's target outputs against the fine-tuned base's, paired by test input (counts of target and "
    "counted outputs per system and seed are reported). Reproduced: the mean share over seeds rises and "
    f"p < {verdicts.ALPHA} with more targets from the Plugin in most seeds; direction only: the mean share rises; "
    "not reproduced: it does not."
)


def test_references(dataset: str, profile: Profile) -> list[str]:
    """The first reference of each of the profile's test inputs (fresh ones included)."""
    return [ex.references[0] for ex in tasks.task_splits(dataset, profile)[2]]


def shift_runs(dataset: str, profile: Profile, seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot on the original and on the fine-tuned base, and Plugin on the fine-tuned base.

    Each record gets a ``base`` field: "original" or "fine-tuned".
    """
    model_name, path, _ = shift_setup(dataset, profile, progress=progress)
    original = runner.load_task(model_name, dataset, profile)
    tuned = runner.load_task(finetune.load_finetuned_base(path, profile.dtype), dataset, profile,
                             prompt_model=model_name)
    tasks = {"original": original, "fine-tuned": tuned}
    return [{**runner.run_experiment(tasks[base], method, seed, profile, progress=progress), "base": base}
            for base, method, seed in shift_jobs(seeds)]


def shift_setup(dataset: str, profile: Profile, *, progress: bool = False
                ) -> tuple[str, finetune.FinetunedBase, finetune.Pool]:
    """(the base, its fine-tuned version, the fine-tuning pool) of the shift study on ``dataset``.
    The fine-tuning recipe is the ablations'; its epochs and pool size are the profile's ``shift``."""
    setup = dataclasses.replace(profile.ablations, finetune_epochs=(profile.shift.epochs,),
                                finetune=profile.shift.finetune or profile.ablations.finetune)
    model_name = profile.shift.model or setup.model
    pool = finetune.finetune_pool(dataset, profile, max_pairs=profile.shift.pool_pairs)
    (tuned,) = finetune.finetuned_bases(model_name, pool, setup, prompt_style=profile.prompts, tokens=profile.tokens,
                                        records=finetune.records_dir(profile), progress=progress).values()
    return model_name, tuned, pool


def shift_jobs(seeds: Sequence[int]) -> list[tuple[str, str, int]]:
    """(base, method, seed) of :func:`shift_runs` (also the grid's units)."""
    return [("original", "Zeroshot", seeds[0]), ("fine-tuned", "Zeroshot", seeds[0])] + \
        [("fine-tuned", "Plugin", seed) for seed in seeds]


def units(profile: Profile, notebook: str, *, datasets: Sequence[str], seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of notebook 10 with its parameters: the fine-tuning and the runs."""
    profile = load_profile(profile, seeds=seeds)
    found = []
    for dataset in datasets:
        model_name, tuned, pool = shift_setup(dataset, profile)
        pairs = len(data.training_pairs(pool.examples))
        pair_tokens = count_task(dataset, model_name, profile).pair_tokens
        tuning = grid.finetune_unit(tuned, dataset, profile, notebook,
                                    {"finetune_tokens": profile.shift.epochs * pairs * pair_tokens})
        refs = {"original": grid.TaskRef(model_name, dataset), "fine-tuned": grid.finetuned_ref(tuned, dataset)}
        found.append(tuning)
        for base, ref in refs.items():
            jobs = [(m, s, m, None, False) for b, m, s in shift_jobs(profile.seeds) if b == base]
            found += grid.task_units(ref, profile, jobs, notebook, needs=(tuning.key,) if base == "fine-tuned" else ())
    return found


def shift_table(dataset: str, records: Sequence[dict], references: Sequence[str]) -> pd.DataFrame:
    """The judged share per system (mean over seeds), with the test references for scale."""
    spec = SHIFTS[dataset]
    rows = [{"system": "test references", "share": spec["judge"](list(references)).share, "seeds": 1}]
    for base, method in (("original", "Zeroshot"), ("fine-tuned", "Zeroshot"), ("fine-tuned", "Plugin")):
        runs = [r for r in records if r["base"] == base and r["method"] == method]
        shares = [spec["judge"](r["predictions"]).share for r in runs]
        shares = [s for s in shares if s is not None]
        rows.append({"system": f"{method} ({base} base)", "share": sum(shares) / len(shares) if shares else None,
                     "seeds": len(runs)})
    return pd.DataFrame(rows).set_index("system")


def gpt4o_shares(dataset: str, records: Sequence[dict]) -> pd.DataFrame:
    """The paper's GPT-4o question on the fine-tuned base's and the Plugin's first-seed outputs
    (status "skipped" without OPENAI_API_KEY)."""
    rows = []
    for method in ("Zeroshot", "Plugin"):
        run = next(r for r in records if r["base"] == "fine-tuned" and r["method"] == method)
        result = judge.gpt4o_judge(run["predictions"], SHIFTS[dataset]["question"])
        rows.append({"system": f"{method} (fine-tuned base)", "share": result.share, "status": result.status})
    return pd.DataFrame(rows)


def _counts(dataset: str, run: dict) -> dict:
    """Target and counted outputs of one run (``SHIFTS``), and per input whether it is a target."""
    spec = SHIFTS[dataset]
    targets = [bool(spec["target"](text)) for text in run["predictions"]]
    counted = sum(bool(spec["counted"](text)) for text in run["predictions"])
    return {"targets": targets, "target outputs": sum(targets), "counted outputs": counted,
            "outputs": len(targets), "share": sum(targets) / counted if counted else None}


def _paired_test(dataset: str, a: dict, b: dict) -> dict:
    """A against B: exact McNemar on the target outputs when both runs are on the same test
    inputs, else Fisher's exact test of the two shares."""
    ca, cb = _counts(dataset, a), _counts(dataset, b)
    if list(a.get("test_ids", [])) == list(b.get("test_ids", [])):
        test = verdicts.mcnemar_exact(ca["targets"], cb["targets"])
        more, fewer = test["a_only"] > test["b_only"], test["a_only"] < test["b_only"]
        result = {"test": "exact McNemar", "a_only": test["a_only"], "b_only": test["b_only"], "p": test["p"]}
    else:
        p = verdicts.two_proportion_exact(ca["target outputs"], ca["counted outputs"],
                                          cb["target outputs"], cb["counted outputs"])
        more = ca["target outputs"] * cb["counted outputs"] > cb["target outputs"] * ca["counted outputs"]
        fewer = ca["target outputs"] * cb["counted outputs"] < cb["target outputs"] * ca["counted outputs"]
        result = {"test": "Fisher exact", "p": p}
    drop = ("targets",)
    return {**result, "a": {k: v for k, v in ca.items() if k not in drop},
            "b": {k: v for k, v in cb.items() if k not in drop}, "more": more, "fewer": fewer}


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def check_shift(dataset: str, records: Sequence[dict]) -> tuple[str, str, dict]:
    """(verdict, ours, statistic) of the distribution-shift claim under ``SHIFT_RULE``."""
    original = next(r for r in records if r["base"] == "original" and r["method"] == "Zeroshot")
    tuned = next(r for r in records if r["base"] == "fine-tuned" and r["method"] == "Zeroshot")
    plugins = sorted((r for r in records if r["base"] == "fine-tuned" and r["method"] == "Plugin"),
                     key=lambda r: r["seed"])
    premise = _paired_test(dataset, tuned, original)
    shares = {"original base": premise["b"]["share"], "fine-tuned base": premise["a"]["share"]}
    n = {"inputs": premise["a"]["outputs"], "seeds": len(plugins)}
    lower = (premise["a"]["share"] is not None and premise["b"]["share"] is not None
             and premise["a"]["target outputs"] * premise["b"]["counted outputs"]
             < premise["b"]["target outputs"] * premise["a"]["counted outputs"])
    biased = lower and premise["fewer"] and verdicts.significant(premise["p"])
    counts = (f"{premise['b']['target outputs']}/{premise['b']['counted outputs']} -> "
              f"{premise['a']['target outputs']}/{premise['a']['counted outputs']}")
    if not biased:
        ours = (f"premise not recreated: fine-tuning moved the share from {_share(shares['original base'])} "
                f"(original base) to {_share(shares['fine-tuned base'])} ({counts} target/counted outputs); the "
                f"fine-tuned base gives {'fewer' if premise['fewer'] else 'no fewer'} target outputs than the "
                f"original ({premise['test']} p = {premise['p']:.3g})")
        statistic = {"summary": f"premise fails: share {_share(shares['original base'])} -> "
                                f"{_share(shares['fine-tuned base'])} after fine-tuning (p = {premise['p']:.3g})",
                     "n": n, "premise": premise, "shares": shares}
        return verdicts.NOT_MEASURABLE, ours, statistic
    per_seed = {int(run["seed"]): _paired_test(dataset, run, tuned) for run in plugins}
    plugin_shares = [t["a"]["share"] for t in per_seed.values() if t["a"]["share"] is not None]
    mean_share = sum(plugin_shares) / len(plugin_shares) if plugin_shares else None
    rises = mean_share is not None and shares["fine-tuned base"] is not None and mean_share > shares["fine-tuned base"]
    passing = [seed for seed, t in per_seed.items() if t["more"] and verdicts.significant(t["p"])]
    verdict = verdicts.verdict(rises, verdicts.most(len(passing), len(per_seed)))
    ours = (f"{_share(shares['fine-tuned base'])} -> {_share(mean_share)} (mean over seeds); target/counted outputs "
            f"per seed: " + ", ".join(f"seed {s} {t['a']['target outputs']}/{t['a']['counted outputs']}"
                                      for s, t in per_seed.items())
            + f" vs the base's {premise['a']['target outputs']}/{premise['a']['counted outputs']}")
    statistic = {"summary": f"{_share(shares['fine-tuned base'])} -> {_share(mean_share)}; McNemar p "
                            + "/".join(f"{t['p']:.3f}" for t in per_seed.values())
                            + f"; {n['inputs']} inputs, {n_seeds(n['seeds'])}",
                 "n": n, "premise": premise, "shares": {**shares, "Plugin (mean over seeds)": mean_share},
                 "per seed": per_seed, "seeds significant": passing}
    return verdict, ours, statistic


def record_claims(profile: Profile | str, dataset: str, records: Sequence[dict]) -> dict:
    """The distribution-shift claim of ``dataset`` under ``SHIFT_RULE``, from ``shift_runs``'s records."""
    spec = SHIFTS[dataset]
    paper_base, paper_plugin = published.shift(dataset)
    verdict, ours, statistic = check_shift(dataset, records)
    return record_claim(profile, f"shift_{dataset}",
                        f"{dataset}: Plugin raises the share of {spec['what']} over the fine-tuned base",
                        f"{paper_base:.2%} -> {paper_plugin:.2%} (GPT-4o judge)", ours, verdict,
                        rule=SHIFT_RULE, statistic=statistic)


def shift_figure(tables: dict[str, pd.DataFrame]):
    """Bars of the judged share per system, one panel per dataset."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = pd.concat({d: t.reset_index() for d, t in tables.items()}, names=["dataset"]).reset_index(level=0)
    # One row label per bar, and a share with no judged output (None: e.g. no gendered output at
    # all, as from a random-weight twin) as a missing bar rather than an object column.
    long = long.reset_index(drop=True).assign(share=lambda f: pd.to_numeric(f["share"], errors="coerce"))
    grid = sns.catplot(data=long, x="share", y="system", col="dataset", kind="bar", height=3, aspect=1.6, sharex=False)
    grid.set_titles("{col_name}")
    plt.close(grid.figure)
    return grid.figure
