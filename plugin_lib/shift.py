"""Distribution shift (the paper's Section 6.4, notebook 10).

The base is fine-tuned on a biased training split: WebNLG's *infrastructure* categories, or
CommonGen scenes about a *man*. A Plugin is then trained, on top of that fine-tuned base, on
the validation data, which is about *persons* (WebNLG) or both genders (CommonGen). The
paper (LLaMA-3.1-8B, GPT-4o as judge) reports the share of Person-related outputs going from
17.99% (fine-tuned base) to 71.34% (Plugin), and the share of woman-related outputs among
gendered ones from 10.37% to 31.92%. Here the judge is the offline word-list judge of
``plugin_lib.judge`` (validated on references with known labels); GPT-4o runs too when an
OpenAI key is set.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from . import ablations, judge, runner
from .report import record_claim

SHIFTS = {
    "webnlg": {"judge": judge.person_judge, "question": judge.PAPER_PERSON_QUESTION,
               "what": "Person-related outputs", "paper": (0.1799, 0.7134)},
    "commongen": {"judge": judge.woman_judge, "question": judge.PAPER_WOMAN_QUESTION,
                  "what": "woman-related outputs among gendered ones", "paper": (0.1037, 0.3192)},
}
# Fine-tuning epochs and pool size per profile (the fine-tuning recipe is the ablation's).
SETTINGS = {"paper": {"epochs": 2, "pool_pairs": None}, "local": {"epochs": 2, "pool_pairs": 300},
            "smoke": {"epochs": 1, "pool_pairs": 16}}


def shift_runs(dataset: str, profile: dict, seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot on the original and on the fine-tuned base, and Plugin on the fine-tuned base.

    Each record gets a ``base`` field: "original" or "fine-tuned".
    """
    setup = ablations.settings(profile["name"], finetune_epochs=[SETTINGS[profile["name"]]["epochs"]])
    model_name = setup["model"] if profile["name"] != "paper" else profile["base_models"][-1]
    pool = ablations.finetune_pool(dataset, profile, max_pairs=SETTINGS[profile["name"]]["pool_pairs"])
    (path,) = ablations.finetuned_bases(model_name, pool, setup, progress=progress).values()
    original = runner.load_task(model_name, dataset, profile)
    tuned = ablations.ablation_task(ablations.load_finetuned_base(path, profile.get("dtype")), dataset, profile,
                                    model_name)
    records = [{**runner.run_experiment(original, "Zeroshot", seeds[0], profile, progress=progress), "base": "original"},
               {**runner.run_experiment(tuned, "Zeroshot", seeds[0], profile, progress=progress), "base": "fine-tuned"}]
    records += [{**runner.run_experiment(tuned, "Plugin", seed, profile, progress=progress), "base": "fine-tuned"}
                for seed in seeds]
    return records


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


def record_shift_claim(dataset: str, table: pd.DataFrame, profile: str) -> dict:
    spec = SHIFTS[dataset]
    base, plugin = table.loc["Zeroshot (fine-tuned base)", "share"], table.loc["Plugin (fine-tuned base)", "share"]
    paper_base, paper_plugin = spec["paper"]
    if base is None or plugin is None:
        ours, verdict = "no output was judged (no gendered output)", "not measurable at this scale"
    else:
        ours, verdict = f"{base:.1%} -> {plugin:.1%}", "reproduced" if plugin > base else "not reproduced"
    return record_claim(profile, f"shift_{dataset}",
                        f"{dataset}: Plugin raises the share of {spec['what']} over the fine-tuned base",
                        f"{paper_base:.2%} -> {paper_plugin:.2%} (GPT-4o judge)", ours, verdict)


def shift_figure(tables: dict[str, pd.DataFrame]):
    """Bars of the judged share per system, one panel per dataset."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = pd.concat({d: t.reset_index() for d, t in tables.items()}, names=["dataset"]).reset_index(level=0)
    grid = sns.catplot(data=long, x="share", y="system", col="dataset", kind="bar", height=3, aspect=1.6, sharex=False)
    grid.set_titles("{col_name}")
    plt.close(grid.figure)
    return grid.figure
