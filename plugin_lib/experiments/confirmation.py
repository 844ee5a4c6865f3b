"""The preregistered confirmation, judged: the stored runs of the ``confirm`` profile under the
rules frozen in ``report.preregistered`` (docs/preregistration.md).

This module only finds, for each claim, the runs that play its roles (A, B, premises) and the
numbers its frozen test reads; it changes no rule. A claim whose runs are not all stored yet is
reported as waiting, with what is missing, and gets no verdict.

    plugin-repro confirmation status   # which claims can be judged, what is missing
    plugin-repro confirmation judge    # record the verdicts (results/confirm/claims)

(``commands.confirmation``, the command line of both waves).

The notebooks run under ``--profile confirm`` make the runs (their own, exploratory rules go to
``results/confirm/notebook-claims``); this module records the confirmatory claims.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import sys
from collections.abc import Callable, Sequence

import pandas as pd

from .. import analysis, data
from ..analysis import judge as shift_judge
from ..harness.baselines import bdpl, finetune
from ..harness import methods, tasks
from ..harness.running import run_store
from ..harness.machine import results_dir
from ..harness.profile import Profile, REPO_ROOT, load_profile
from ..report import freeze, mixed
from ..report import preregistered as pre
from ..report.claim_summary import summary, versus_labels
from ..report.claims import record_claim
from ..utils.io import atomic_write_json, read_json

PROFILE = freeze.FROZEN_PROFILE
FROZEN_INPUTS = REPO_ROOT / "plugin_lib" / "report" / "preregistered_inputs.json"
# Each preregistered profile's test inputs, frozen with its rules (waves 1 and 2: confirm; 3: wave3; 4: wave4).
FROZEN_INPUT_FILES = {PROFILE: FROZEN_INPUTS,
                      "wave3": REPO_ROOT / "plugin_lib" / "report" / "preregistered_wave3_inputs.json",
                      "wave4": REPO_ROOT / "plugin_lib" / "report" / "preregistered_wave4_inputs.json"}


class Missing(LookupError):
    """A run, prompt or table that a claim needs is not stored yet."""


def _inputs_file(profile_name: str):
    if profile_name not in FROZEN_INPUT_FILES:
        raise ValueError(f"Profile {profile_name!r} has no frozen test inputs; the preregistered profiles: "
                         f"{', '.join(FROZEN_INPUT_FILES)}.")
    return FROZEN_INPUT_FILES[profile_name]


@functools.lru_cache(maxsize=4)
def frozen_inputs(profile_name: str = PROFILE) -> dict:
    return json.loads(_inputs_file(profile_name).read_text(encoding="utf-8"))["datasets"]


def _digest(test: Sequence[data.Example]) -> str:
    payload = json.dumps([[e.id, e.source, list(e.references)] for e in test], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def check_test_inputs(dataset: str, profile: Profile) -> None:
    """Refuse, before anything runs, a machine whose ``dataset`` gives ``profile`` other test
    inputs than the frozen ones (ids, sources and references, by their SHA-256)."""
    if _digest(tasks.task_splits(dataset, profile)[2]) != frozen_inputs(profile.name)[dataset]["sha256"]:
        raise ValueError(f"{dataset}: the test inputs of profile {profile.name!r} differ from the frozen ones "
                         f"({_inputs_file(profile.name)}); check the data: plugin-repro data check --profile "
                         f"{profile.name}.")


def freeze_test_inputs(profile: Profile) -> dict:
    """Write ``profile``'s test inputs per dataset (ids, and the SHA-256 that
    :func:`check_test_inputs` compares) to its file of ``FROZEN_INPUT_FILES``: done once, in the
    commit that freezes its rules."""
    datasets = {}
    for dataset in data.DATASETS:
        test = tasks.task_splits(dataset, profile)[2]
        datasets[dataset] = {"n": len(test), "sha256": _digest(test), "ids": [e.id for e in test]}
    frozen = {"about": f"The test inputs of the {profile.name} profile, frozen with its rules: "
                       "harness.tasks.task_splits under that profile (test_inputs in profiles.yaml) on the data of "
                       "shared/data/SHA256SUMS.txt. experiments.confirmation refuses runs on any other inputs. "
                       "sha256: of the JSON list of [id, source, references] in this order.",
              "datasets": datasets}
    atomic_write_json(_inputs_file(profile.name), frozen)
    return frozen


@functools.lru_cache(maxsize=8)
def _examples(dataset: str) -> dict[str, data.Example]:
    return {ex.id: ex for split in ("validation", "test") for ex in data.load_dataset(dataset, split)}


def references(dataset: str, ids: Sequence[str]) -> list[list[str]]:
    examples = _examples(dataset)
    return [list(examples[i].references) for i in ids]


def stored_runs(profile: Profile, dataset: str, model: str, label: str, check_inputs: bool = True) -> list[dict]:
    """The stored runs of ``label`` (one per seed), refusing any not on the frozen test inputs."""
    folder = run_store.runs_dir(profile, dataset, model)
    runs = [read_json(p) for p in sorted(folder.glob(f"{label}-seed*.json"))
            if re.fullmatch(rf"{re.escape(label)}-seed\d+\.json", p.name)]
    if not runs:
        raise Missing(f"{dataset}/{model}: no {label} run")
    if check_inputs:
        frozen = frozen_inputs(profile.name)[dataset]["ids"]
        for run in runs:
            if list(run["test_ids"]) != frozen:
                raise ValueError(f"{folder}/{label}-seed{run['seed']}.json is not on the frozen test inputs of {dataset}.")
    return runs


def _seeded(profile: Profile, runs: list[dict], label: str) -> list[dict]:
    """All the profile's seeds, or Missing. A deterministic method (``methods.UNSEEDED_METHODS``,
    its label before any "@") has the first seed's run only; every other label needs them all,
    so a trained method with one seed stored waits rather than being judged on that seed."""
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{label}: more than one stored run of seed(s) "
                         f"{sorted({s for s in seeds if seeds.count(s) > 1})}; keep one file per seed.")
    expected = profile.seeds[:1] if label.split("@")[0] in methods.UNSEEDED_METHODS else profile.seeds
    if set(seeds) != set(expected):
        raise Missing(f"{label}: seeds {sorted(seeds)} of {list(expected)}")
    # One seed made under other settings or data is stale (the grid redoes it): wait for it. BDPL's
    # settings hold each seed's own prompt, so only its data must agree.
    fields = ("inputs",) if label.startswith("BDPL") else ("inputs", "settings")
    for field in fields:
        if len({r.get(field) for r in runs}) > 1:
            raise Missing(f"{label}: seeds made from different {field} (a stale one is redone by the grid)")
    return runs


class Roles:
    """Where each role of ``report.preregistered.CLAIMS`` finds its runs."""

    def __init__(self, profile: Profile, check_inputs: bool = True):
        self.profile, self.check_inputs = profile, check_inputs
        self.base = profile.base_models[0]

    def runs(self, dataset: str, label: str, model: str | None = None) -> list[dict]:
        runs = stored_runs(self.profile, dataset, model or self.base, label, self.check_inputs)
        return _seeded(self.profile, runs, label)

    def finetuned_folder(self, dataset: str, epochs: int, *, shift: bool = False) -> str:
        """The run folder's model name of the base fine-tuned for ``epochs`` (notebooks 06 and 10)."""
        setup = dataclasses.replace(self.profile.ablations, finetune_epochs=(epochs,))
        pairs = self.profile.shift.pool_pairs if shift else setup.finetune_pool_pairs
        pool = finetune.finetune_pool(dataset, self.profile, max_pairs=pairs)
        model = (self.profile.shift.model or setup.model) if shift else setup.model
        bases = finetune.finetuned_bases(model, pool, setup, prompt_style=self.profile.prompts,
                                         tokens=self.profile.tokens)
        return bases[epochs].name  # its name only: nothing is fine-tuned

    def bdpl_prompts(self, budget: int | None = None) -> list[dict]:
        paths = [bdpl.prompt_path(self.profile, "e2e", self.base, s, budget) for s in self.profile.seeds]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise Missing(f"BDPL prompts {missing}")
        return [read_json(p) for p in paths]

    def learning_budget(self) -> int | None:
        """The smallest of ``bdpl_learning_budgets`` at which seed 0's BDPL learned (hyper-validation)."""
        for budget in self.profile.wrapper.bdpl_learning_budgets or ():
            path = bdpl.prompt_path(self.profile, "e2e", self.base, self.profile.seeds[0], budget)
            if not path.exists():
                raise Missing(f"BDPL prompt at {budget} calls (seed {self.profile.seeds[0]})")
            if pre.bdpl_learned([read_json(path)])["per seed"][0]["learned"]:
                return budget
        return None

    def role(self, dataset: str, name: str) -> list[dict]:
        """The runs of a plain role: a method label, optionally ``@learning`` (BDPL's budget)."""
        if name.endswith("@learning"):
            budget = self.learning_budget()
            if budget is None:
                raise Missing("BDPL learned at none of the learning budgets")
            return self.runs(dataset, name.replace("@learning", f"@{budget}calls"))
        return self.runs(dataset, name)


def comparisons(roles: Roles, c: pre.Claim) -> list[tuple[list[dict], list[dict]]]:
    """(A's runs, B's runs) per comparison of a superiority, non-superiority or equivalence claim."""
    d = c.dataset
    if c.a == "Plugin@every-base":
        bases = [roles.base] + [roles.finetuned_folder(d, k) for k in roles.profile.ablations.finetune_epochs if k]
        return [(roles.runs(d, "Plugin", b), roles.runs(d, "Zeroshot", b)) for b in bases]
    if c.a == "Plugin@longest-finetuned":
        longest = roles.finetuned_folder(d, max(roles.profile.ablations.finetune_epochs))
        return [(roles.runs(d, "Plugin", longest), roles.runs(d, "Plugin"))]
    if c.a == "Plugin-deeper":
        deeper = [k for k in roles.profile.ablations.layers if k != 1]
        return [(roles.runs(d, f"Plugin-{k}L"), roles.runs(d, "Plugin")) for k in deeper]
    if c.b == ("Plugin-same-depth",):
        depth = roles.profile.ablations.pretrained_layers or 1
        return [(roles.runs(d, "Plugin-pretrained"), roles.runs(d, "Plugin" if depth == 1 else f"Plugin-{depth}L"))]
    if c.key.startswith("topk_"):
        k = int(c.key.rsplit("top-", 1)[1])
        view = f"{roles.base}@top{k}-residual"
        return [(roles.runs(d, "Plugin", view), roles.runs(d, "Zeroshot", view))]
    return [_same_inputs(roles.role(d, c.a), roles.role(d, b)) for b in c.b]


def _same_inputs(a: list[dict], b: list[dict]) -> tuple[list[dict], list[dict]]:
    """A and B on one base must come from the same data (``run_keys.inputs_fingerprint``)."""
    if a[0]["model"] == b[0]["model"] and a[0].get("inputs") != b[0].get("inputs"):
        raise Missing(f"{a[0]['method']} and {b[0]['method']} were made from different data "
                      "(a stale one is redone by the grid)")
    return a, b


def premise(roles: Roles, c: pre.Claim) -> dict | None:
    """The premise's result (``holds`` and its numbers), or None for a claim without one."""
    if c.premise is None:
        return None
    if c.premise == "bdpl learned":
        return pre.bdpl_learned(roles.bdpl_prompts())
    if c.premise == "bdpl learned at the learning budget":
        budget = roles.learning_budget()
        if budget is None:
            return {"holds": False, "why": "BDPL learned at none of the budgets "
                                           f"{list(roles.profile.wrapper.bdpl_learning_budgets or ())}"}
        return {"budget": budget, **pre.bdpl_learned(roles.bdpl_prompts(budget))}
    if c.premise == "fine-tuning improves the base":
        longest = roles.finetuned_folder(c.dataset, max(roles.profile.ablations.finetune_epochs))
        tuned, original = roles.runs(c.dataset, "Zeroshot", longest), roles.runs(c.dataset, "Zeroshot")
        return pre.improves_base(pre.compare(tuned, original, references(c.dataset, tuned[0]["test_ids"])))
    if c.premise == "shift base biased":
        base = shift_counts(roles.runs(c.dataset, "Zeroshot", roles.finetuned_folder(c.dataset, roles.profile.shift.epochs,
                                                                                      shift=True)), c.dataset)[0]
        refs = [r for refs in references(c.dataset, frozen_inputs()[c.dataset]["ids"]) for r in refs]
        ref_target, ref_counted = (sum(x) for x in _shift_indicators(refs, c.dataset))
        return pre.biased_against_target(int(sum(base[0])), int(sum(base[1])), ref_target, ref_counted)
    raise ValueError(f"Unknown premise {c.premise!r}")


def _shift_indicators(texts: Sequence[str], dataset: str) -> tuple[list[int], list[int]]:
    """Per text: (target, counted). WebNLG: Person-related among all; CommonGen: woman-related
    (a woman word, mixed texts included) among gendered texts."""
    if dataset == "webnlg":
        return [int(shift_judge.is_person_related(t)) for t in texts], [1] * len(texts)
    genders = [shift_judge.gender_of(t) for t in texts]
    return [int(g in ("woman", "both")) for g in genders], [int(g is not None) for g in genders]


def shift_counts(runs: Sequence[dict], dataset: str) -> list[tuple[list[int], list[int]]]:
    return [_shift_indicators(run["predictions"], dataset) for run in sorted(runs, key=lambda r: r["seed"])]


def judge_claim(roles: Roles, c: pre.Claim) -> dict:
    """The frozen rule's result for one claim: ``verdict`` and its statistic."""
    found = premise(roles, c)
    if found is not None and not found["holds"]:
        return {"verdict": pre.NOT_MEASURABLE, "premise": found}
    result: dict
    if c.test in ("superiority", "non-superiority", "equivalence"):
        pairs = comparisons(roles, c)
        compared = [pre.compare(a, b, references(c.dataset, a[0]["test_ids"])) for a, b in pairs]
        result = pre.judge_comparisons(c, compared)
        mixed.note_deficits(c.test, result["comparisons"], compared)  # every test type: shown beside the verdict
        for row, label in zip(result["comparisons"], versus_labels(pairs)):
            row["versus"] = label
    elif c.test == "ratio" and c.key.startswith("shift_"):
        folder = roles.finetuned_folder(c.dataset, roles.profile.shift.epochs, shift=True)
        result = pre.ratio_compare(shift_counts(roles.runs(c.dataset, "Plugin", folder), c.dataset),
                                   shift_counts(roles.runs(c.dataset, "Zeroshot", folder), c.dataset))
    elif c.test == "ratio":
        words = training_domain_words(roles.profile)
        plugin, base = roles.runs("adidas", "Plugin"), roles.runs("adidas", "Zeroshot")
        result = pre.ratio_compare([analysis.coverage_counts(r["predictions"], words) for r in plugin],
                                   [analysis.coverage_counts(r["predictions"], words) for r in base])
        result["domain words"] = list(words["word"])
    elif c.test == "sign":
        plugin, rival = roles.runs("adidas", "Plugin"), roles.runs("adidas", c.b[0])
        refs = references("adidas", plugin[0]["test_ids"])
        by_seed = {r["seed"]: r for r in rival}
        outcomes = []
        for run in plugin:
            other = rival[0] if len(rival) == 1 else by_seed[run["seed"]]
            won = analysis.preference_outcomes(analysis.embedding_similarity(run["predictions"], refs),
                                               analysis.embedding_similarity(other["predictions"], refs))
            outcomes.append([{1.0: 1, 0.0: -1}.get(float(w), 0) for w in won])
        result = pre.sign_test_over_inputs(outcomes)
    elif c.test == "spread":
        labels = ["Plugin", *c.b]
        result = pre.narrower_spread({label: {m: [r["metrics"][m] for r in roles.runs(c.dataset, label)]
                                              for m in pre.METRIC_NAMES} for label in labels}, "Plugin")
    elif c.test == "flops":
        from ..harness import flops

        counts = flops.gpt2_xl_comparison(new_tokens=64)
        result = {"verdict": pre.flops_verdict(counts["plugin_flops"], counts["lora_flops"]),
                  "plugin_flops": int(counts["plugin_flops"]), "lora_flops": int(counts["lora_flops"]),
                  "n": {"inputs": None, "seeds": None}}
    elif c.test == "rate":
        row = theorem1_slope(roles.profile)
        result = {"verdict": pre.rate_verdict(float(row.ci95_low), float(row.ci95_high)), "slope": float(row.slope),
                  "ci95": [float(row.ci95_low), float(row.ci95_high)],
                  "n": {"inputs": None, "seeds": len(roles.profile.theorem1.seeds)}}
    else:
        raise ValueError(f"Unknown test {c.test!r}")
    if found is not None:
        result["premise"] = found
    return result


def theorem1_slope(profile: Profile) -> pd.Series:
    """Notebook 13's fitted slope of the excess loss, from the profile's ``fit_from``."""
    path = results_dir(profile) / "tables" / "theorem1_slopes.csv"
    if not path.exists():
        raise Missing("tables/theorem1_slopes.csv (notebook 13)")
    slopes = pd.read_csv(path)
    rows = slopes[(slopes.metric == "excess_loss") & (slopes.fit_from_tokens == profile.theorem1.fit_from)]
    if rows.empty:
        raise Missing(f"a slope fitted from {profile.theorem1.fit_from} tokens in tables/theorem1_slopes.csv "
                      "(notebook 13, run again)")
    return rows.iloc[0]


def training_domain_words(profile: Profile) -> pd.DataFrame:
    """The top-50 domain words of the Adidas descriptions the Plugin trains and stops on (the
    task's training and hyper-validation references), never a test reference."""
    train, hyper, _ = tasks.task_splits("adidas", profile)
    return analysis.style_words([r for ex in train + hyper for r in ex.references])


def gather(roles: Roles, c: pre.Claim) -> None:
    """Raise Missing when anything the claim's test reads is not stored (computes nothing). A
    failed premise is enough, as in ``judge_claim``: the claim is then not measurable."""
    if c.premise and not premise(roles, c)["holds"]:
        return
    if c.test in ("superiority", "non-superiority", "equivalence"):
        comparisons(roles, c)
    elif c.test == "ratio" and c.key.startswith("shift_"):
        folder = roles.finetuned_folder(c.dataset, roles.profile.shift.epochs, shift=True)
        roles.runs(c.dataset, "Plugin", folder), roles.runs(c.dataset, "Zeroshot", folder)
    elif c.test in ("ratio", "sign", "spread"):
        for label in ("Plugin", *c.b):
            roles.runs(c.dataset, label)
    elif c.test == "rate":
        theorem1_slope(roles.profile)


def claim_states(claims: Sequence, ready) -> pd.DataFrame:
    """Per claim: "ready", or what ``ready(claim)`` found missing (``Missing``) or wrong."""
    rows = []
    for c in claims:
        try:
            ready(c)
            state = "ready"
        except Missing as why:
            state = f"waiting: {why}"
        except ValueError as error:
            state = f"cannot be judged: {error}"
        rows.append({"claim": c.key, "notebook": c.notebook, "state": state})
    return pd.DataFrame(rows)


def status(profile: Profile | None = None, check_inputs: bool = True) -> pd.DataFrame:
    """Per preregistered claim: ready to judge, or what is missing."""
    roles = Roles(profile or load_profile(PROFILE), check_inputs)
    return claim_states(pre.CLAIMS, lambda c: gather(roles, c))


def judge_each(claims: Sequence, keys: Sequence[str] | None, judge_one: Callable, record_one: Callable) -> list[dict]:
    """Every wave's judging loop: each claim of ``claims`` (or of ``keys``) judged
    (``judge_one(claim)``: its result, or ``Missing`` while its runs are not all stored) and
    recorded (``record_one(claim, result)``); a claim that cannot be judged (``ValueError``,
    e.g. runs on other test inputs) is named and the others still go on, then the call fails."""
    recorded, failed = [], []
    for c in claims:
        if keys and c.key not in keys:
            continue
        try:
            result = judge_one(c)
        except Missing as why:
            print(f"{c.key}: waiting ({why})")
            continue
        except ValueError as error:
            print(f"{c.key}: cannot be judged ({error})", file=sys.stderr)
            failed.append(f"{c.key}: {error}")
            continue
        recorded.append(record_one(c, result))
    if failed:
        raise ValueError(f"{len(failed)} claim(s) could not be judged, the others were recorded:\n" + "\n".join(failed))
    return recorded


def record_wave_claim(profile: Profile, rules, c: pre.Claim, result: dict, line: str, *, frozen_at: str,
                      n: dict, test_inputs: str, confirmatory: bool) -> dict:
    """Store a claim of wave 3 or later: ``rules`` is the wave's frozen module (its ``WAVE``,
    ``rule_text`` and ``group``), ``line`` the claim's one-line summary."""
    return record_claim(
        profile, c.key, f"{c.claim} (notebook {c.notebook}; wave {rules.WAVE})", "", line, result["verdict"],
        rule=rules.rule_text(c), scope=c.scope, preregistered=True,
        statistic={"summary": line, "n": n, "result": result, "wave": rules.WAVE, "frozen_at": frozen_at,
                   "group": rules.group(c), "confirmatory": confirmatory, "test inputs": test_inputs})


def judge(profile: Profile | None = None, keys: Sequence[str] | None = None, check_inputs: bool = True) -> list[dict]:
    """Record the verdict of every preregistered claim whose runs are stored (or of ``keys``)."""
    profile = profile or load_profile(PROFILE)
    roles = Roles(profile, check_inputs)

    def record(c: pre.Claim, result: dict) -> dict:
        exploratory = results_dir("local") / "claims" / f"{c.key}.json"
        paper = read_json(exploratory).get("paper", "") if exploratory.exists() else ""
        n = result.get("n") or (result.get("comparisons") or [{}])[0].get("n") or {"inputs": None, "seeds": None}
        return record_claim(
            profile, c.key, f"{c.claim} (notebook {c.notebook})", paper, summary(c, result), result["verdict"],
            rule=pre.rule_text(c), scope=c.scope, preregistered=True,
            statistic={"summary": summary(c, result), "n": n, "result": result, "frozen_at": freeze.FROZEN_AT,
                       "test inputs": f"{profile.rows.test} fresh per dataset "
                                      f"(docs/preregistration.md; seed {profile.test_inputs.seed})"})

    return judge_each(pre.CLAIMS, keys, lambda c: judge_claim(roles, c), record)


MARGIN_FACTORS = (1.0, 0.5, 0.25)
MARGINS_FILE = "margin_sensitivity.json"


def margin_sensitivity(profile: Profile | None = None) -> list[dict]:
    """Each null claim (equivalence, non-superiority) judged again by its frozen test on the same
    runs and bootstrap draws at 1x, 0.5x and 0.25x its frozen margins. The verdict is the one
    at 1x, checked against the committed one; the others show how much it rests on margins that
    were fixed after the exploratory results existed (REPORT.md shows them)."""
    profile = profile or load_profile(freeze.FROZEN_PROFILE)
    roles, rows = Roles(profile), []
    for c in (c for c in pre.CLAIMS if c.test in ("non-superiority", "equivalence")):
        compared = [pre.compare(a, b, references(c.dataset, a[0]["test_ids"])) for a, b in comparisons(roles, c)]
        committed = read_json(results_dir(profile) / "claims" / f"{c.key}.json")["verdict"]
        rows.append(margin_verdicts(c, compared, premise(roles, c), committed))
    return rows


def margin_verdicts(c: pre.Claim, compared: Sequence[dict], found: dict | None, committed: str) -> dict:
    """A null claim's verdicts at ``MARGIN_FACTORS`` times its frozen margins, on its comparisons
    ``compared`` (``found``: its premise's result); RuntimeError where the verdict at 1x is not the
    ``committed`` one: these are then not the runs or the data it was judged on."""
    test = pre.non_superiority if c.test == "non-superiority" else pre.equivalence
    verdicts = {}
    for factor in MARGIN_FACTORS:
        margins = {metric: value * factor for metric, value in pre.MARGINS.items()}
        verdicts[f"{factor:g}x"] = (pre.NOT_MEASURABLE if found is not None and not found["holds"] else
                                    pre.weakest([test(x, margins)["verdict"] for x in compared]))
    if verdicts["1x"] != committed:
        raise RuntimeError(f"{c.key}: at the frozen margins the test gives {verdicts['1x']!r}, but the committed "
                           f"verdict is {committed!r}: these are not the runs or the data it was judged on.")
    return {"key": c.key, "claim": c.claim, "test": c.test, "margins": dict(pre.MARGINS), "verdicts": verdicts}
