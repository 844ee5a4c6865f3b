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

from .. import paper as published
from ..analysis import judge
from ..harness import finetune, runner
from ..harness.profile import Profile
from ..report.claims import record_claim

SHIFTS = {
    "webnlg": {"judge": judge.person_judge, "question": judge.PAPER_PERSON_QUESTION,
               "what": "Person-related outputs"},
    "commongen": {"judge": judge.woman_judge, "question": judge.PAPER_WOMAN_QUESTION,
                  "what": "woman-related outputs among gendered ones"},
}


def shift_runs(dataset: str, profile: Profile, seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot on the original and on the fine-tuned base, and Plugin on the fine-tuned base.

    Each record gets a ``base`` field: "original" or "fine-tuned".
    """
    # The fine-tuning recipe is the ablations'; its epochs and pool size are the profile's ``shift``.
    setup = dataclasses.replace(profile.ablations, finetune_epochs=(profile.shift.epochs,))
    model_name = profile.shift.model or setup.model
    pool = finetune.finetune_pool(dataset, profile, max_pairs=profile.shift.pool_pairs)
    (path,) = finetune.finetuned_bases(model_name, pool, setup, progress=progress).values()
    original = runner.load_task(model_name, dataset, profile)
    tuned = runner.load_task(finetune.load_finetuned_base(path, profile.dtype), dataset, profile,
                             prompt_model=model_name)
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


def record_claims(profile: Profile | str, dataset: str, table: pd.DataFrame) -> dict:
    spec = SHIFTS[dataset]
    base, plugin = table.loc["Zeroshot (fine-tuned base)", "share"], table.loc["Plugin (fine-tuned base)", "share"]
    paper_base, paper_plugin = published.shift(dataset)
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
    # One row label per bar, and a share with no judged output (None: e.g. no gendered output at
    # all, as from a random-weight twin) as a missing bar rather than an object column.
    long = long.reset_index(drop=True).assign(share=lambda f: pd.to_numeric(f["share"], errors="coerce"))
    grid = sns.catplot(data=long, x="share", y="system", col="dataset", kind="bar", height=3, aspect=1.6, sharex=False)
    grid.set_titles("{col_name}")
    plt.close(grid.figure)
    return grid.figure
