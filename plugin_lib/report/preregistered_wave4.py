"""The fourth preregistered wave (issue 73): proxy-tuning and DExperts as published, and the
paper's Figure 2 and Figure 3 claims on WebNLG, CommonGen and Adidas, at CPU scale.

Written and committed on 2026-12-04, in a commit of its own with its frozen test inputs
(``preregistered_wave4_inputs.json``), after the ``wave4`` profile and its units (``cc9628a``,
``e921f0f``) and before any of its runs existed, here or anywhere; ``report.freeze`` checks that
every wave-4 result entered git after it. Its test inputs are 200 per dataset that neither the
``local``, ``confirm`` nor ``wave3`` profile decodes (validation inputs that none of them trains
on or decodes fill a short test split), so no earlier rule and no exploratory number has seen
them. Seen before this file, on other inputs: the exploratory ``local`` runs of notebook 15's
``-pretrained`` arms (``results/local/tables/proxy_*.md``: they chose alpha 0.025 to 0.1), wave
1's E2E verdicts on Figures 2 and 3, wave 2's Plugin-4L runs on the three datasets, and wave 3's
verdicts.

The ``wave4`` profile is the ``confirm`` profile's settings (SmolLM2-135M-Instruct, 3 seeds, the
same grid, search, epoch cap, budget and decoding for every method) with these inputs, the proxy
arms' alphas (proxy-tuning's own sweep, 0.2 to 2.0 in steps of 0.2, and 0.025, 0.05 and 0.1
below it), DExperts' top-p 0.9, and two bases for Figure 2. It reuses wave 1's tests, bootstrap
and vocabulary, wave 2's rule that a significant deficit disqualifies "direction only", and wave
3's premise that an expert helps the base.

**Stand-ins, and their limits, stated before any run:**

- *The pretrained small model* is SmolLM2-135M-Instruct's first 4 blocks with its embeddings,
  final norm and head (``harness.variants.truncated_pretrained``), not a separately pretrained
  small model of the family (GPT2-Small, LLaMA-3.2-1B: the ``paper`` profile's, named in
  profiles.yaml). Untuned, the cut is a poor language model, so the anti-expert's correction is
  not the published one's; the expert (NewModel-pretrained: the cut tuned alone, its own search)
  and Plugin-pretrained (the cut trained through the base, its own search) start from the same
  weights.
- *Figure 2* compares two bases, the original and the base fine-tuned for 5 epochs (4 trainable
  blocks, lr 1e-4, 200 pairs from a pool disjoint from the Plugin's data and the test inputs),
  not the paper's GPT2-M series of four: a trend between its two ends.
- *Figure 3's pretrained initialisation* is the same cut of the base, not GPT2-Small, against a
  4-layer model of the family's architecture from random weights (Plugin-4L), each with its own
  search: a weaker test than the paper's.
- *Adidas* has 54 fresh test inputs, all that are left (its 97 test products and the rest of its
  658 validation products were used by earlier profiles or share a training reference): its
  comparisons have less power than the others' 200.

**Claims**, per dataset:

- ``proxy_same_model``: Plugin-pretrained beats proxy-tuning as published with the same small
  model (four datasets).
- ``proxy_one_layer``: the paper's 1-layer Plugin beats proxy-tuning as published (four datasets).

  In both, the rivals are ProxyTuning-pretrained and DExperts-pretrained. Premise per rival: its
  expert helps the base (wave 3's ``improves_on_base`` on that arm's own alpha search); a rival
  whose premise fails is left out and named, and with no rival left the claim is not measurable.
  **One comparison where the outputs are one**: where DExperts-pretrained decodes exactly
  ProxyTuning-pretrained's outputs on every test input in every seed, it is not compared again.
  The verdict is the weakest of the comparisons left.
- ``base_quality``: the Plugin on the 5-epoch base beats the Plugin on the original (Figure 2's
  trend; three datasets). Premise: wave 1's, the 5-epoch base alone beats the original alone.
- ``plugin_beats_base``: the Plugin beats the base alone on each of the two bases (Figure 2;
  three datasets), the weaker of the two.
- ``pretrained_init``: Plugin-pretrained beats Plugin-4L (Figure 3; three datasets).

Every comparison is wave 1's superiority test (two-level paired bootstrap, Holm over the four
bootstrap metrics) with wave 2's deficit rule. A row of the README per group (``GROUPS``) gets
the weakest verdict of its measurable claims, with the count behind it (wave 2's
``row_verdict``).

**Budget.** Every method's budget is the ``confirm`` profile's. The compute, planned in
process-hours from the stored run seconds of ``confirm``, ``wave3`` and ``local`` at these
settings: about 17 (12 to 25) over 113 units, or 8 to 12 wall hours on 2 cores;
``grid plan --profile wave4 --wave 4`` bounds it at 141 hours (every configuration at its
40-epoch cap).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .preregistered import NOT_MEASURABLE, PREMISES as WAVE1_PREMISES, TESTS, Claim, weakest
from .preregistered_wave2 import row_verdict, superiority_without_deficit
from .preregistered_wave3 import MIN_GAIN, alpha_search_losses, improves_on_base

WAVE = 4
PROFILE = "wave4"
PROXY_DATASETS = ("e2e", "webnlg", "commongen", "adidas")
FIGURE_DATASETS = ("webnlg", "commongen", "adidas")
# The test inputs per dataset (the frozen file holds their ids): Adidas's are all that are left.
INPUTS = {"e2e": 200, "webnlg": 200, "commongen": 200, "adidas": 54}
PROXY_RIVALS = ("ProxyTuning-pretrained", "DExperts-pretrained")
SAME_OUTPUTS_AS = {"DExperts-pretrained": "ProxyTuning-pretrained"}  # one comparison where they decode alike
FINETUNE_EPOCHS = (0, 5)  # Figure 2's bases: the original and the longest fine-tune
BUDGET_PROCESS_HOURS = {"expected": 17, "low": 12, "high": 25, "bound": 141}

# Claims some of whose numbers were seen before this file was committed: none.
SEEN_BEFORE_FREEZE: tuple[str, ...] = ()

GROUPS = {
    "proxy_same_model": "The Plugin from the pretrained small model beats proxy-tuning and DExperts as published",
    "proxy_one_layer": "The 1-layer Plugin beats proxy-tuning and DExperts as published",
    "base_quality": "Figure 2's trend: the Plugin improves as the base improves",
    "plugin_beats_base": "Figure 2: the Plugin beats the base alone on every base",
    "pretrained_init": "Figure 3: pretrained initialisation helps",
}

PREMISES = {
    "expert helps": ("per rival (ProxyTuning-pretrained, DExperts-pretrained), its expert helps the base: in most "
                     f"seeds its chosen alpha's hyper-validation loss is at least {MIN_GAIN} nats per token below "
                     "alpha 0's (the base alone; for DExperts the base's nucleus alone). A rival whose premise fails "
                     "is left out and named"),
    "fine-tuning improves the base": WAVE1_PREMISES["fine-tuning improves the base"],
}

WAVE4_TESTS = {
    "superiority": TESTS["superiority"] + (" A significant deficit (B better on a bootstrap metric, one-sided Holm "
                                           "p < 0.05 with its 95% interval below zero) makes 'direction only' "
                                           "'not reproduced' (wave 2's rule)."),
    "proxy": ("A against each rival left by the premise: " + TESTS["superiority"].removeprefix("A against each B: ")
              + " Wave 2's deficit rule applies. Where DExperts-pretrained decodes exactly ProxyTuning-pretrained's "
                "outputs on every test input in every seed, it is one comparison (proxy-tuning's), not two."),
}

_PROXY_CLAIM = "beats proxy-tuning and DExperts as published (a pretrained small model tuned alone, its untuned copy the anti-expert)"

CLAIMS: tuple[Claim, ...] = (
    *(Claim(f"wave4_proxy_same_model_{d}", "15", f"{d}: the Plugin from the same pretrained small model {_PROXY_CLAIM}",
            "proxy", a="Plugin-pretrained", b=PROXY_RIVALS, premise="expert helps", dataset=d, scope="beyond")
      for d in PROXY_DATASETS),
    *(Claim(f"wave4_proxy_one_layer_{d}", "15", f"{d}: the 1-layer Plugin {_PROXY_CLAIM}", "proxy", a="Plugin",
            b=PROXY_RIVALS, premise="expert helps", dataset=d, scope="beyond") for d in PROXY_DATASETS),
    *(Claim(f"wave4_base_quality_{d}", "06", f"{d}: the Plugin improves as the base improves (the 5-epoch fine-tuned "
            "base against the original)", "superiority", a="Plugin@longest-finetuned", b=("Plugin@original",),
            premise="fine-tuning improves the base", dataset=d) for d in FIGURE_DATASETS),
    *(Claim(f"wave4_plugin_beats_base_{d}", "06", f"{d}: the Plugin beats the base alone on every base (the original "
            "and the 5-epoch fine-tuned)", "superiority", a="Plugin@every-base", b=("Zeroshot@every-base",),
            dataset=d) for d in FIGURE_DATASETS),
    *(Claim(f"wave4_pretrained_init_{d}", "07", f"{d}: pretrained initialisation helps (the base's first 4 blocks "
            "against 4 random layers)", "superiority", a="Plugin-pretrained", b=("Plugin-4L",), dataset=d)
      for d in FIGURE_DATASETS),
)


def group(c: Claim) -> str:
    """The README row a claim belongs to (a key of ``GROUPS``)."""
    return next(g for g in GROUPS if c.key.startswith(f"wave4_{g}_"))


def claim(key: str) -> Claim:
    for c in CLAIMS:
        if c.key == key:
            return c
    raise ValueError(f"No wave-4 claim {key!r}; known: {[c.key for c in CLAIMS]}.")


def rule_text(c: Claim) -> str:
    text = WAVE4_TESTS[c.test]
    if c.premise:
        text = f"Premise: {PREMISES[c.premise]}; if it fails, not measurable at this scale. Then: {text}"
    return text


# ---------------------------------------------------------------- the proxy rivals


def same_outputs(runs_x: Sequence[Mapping], runs_y: Sequence[Mapping]) -> bool:
    """Whether two arms decode the same text on every test input in every seed (the same seeds,
    the same inputs in the same order)."""
    x, y = ({int(r["seed"]): r for r in runs} for runs in (runs_x, runs_y))
    return set(x) == set(y) and all(list(x[s]["test_ids"]) == list(y[s]["test_ids"])
                                    and list(x[s]["predictions"]) == list(y[s]["predictions"]) for s in x)


def expert_helps(runs: Sequence[Mapping]) -> dict:
    """A rival's premise from its run records (one per seed): wave 3's ``improves_on_base`` on
    its alpha search (the chosen alpha's hyper-validation loss against alpha 0's)."""
    return improves_on_base([alpha_search_losses(r) for r in sorted(runs, key=lambda r: r["seed"])])


def proxy_rivals(premises: Mapping[str, Mapping], same: Mapping[str, bool]) -> dict:
    """The rivals a proxy claim compares A with. ``premises``: each rival's ``expert_helps``;
    ``same``: per rival of ``SAME_OUTPUTS_AS``, whether it decodes exactly its partner's outputs.
    Returns ``compared`` (labels, in ``PROXY_RIVALS`` order) and ``left out`` (label: why)."""
    compared, left_out = [], {}
    for rival in PROXY_RIVALS:
        partner = SAME_OUTPUTS_AS.get(rival)
        if partner is not None and same.get(rival):
            left_out[rival] = f"the same outputs as {partner} in every seed: one comparison"
        elif not premises[rival]["holds"]:
            left_out[rival] = "premise failed: its expert does not help the base"
        else:
            compared.append(rival)
    return {"compared": compared, "left out": left_out}


# ---------------------------------------------------------------- verdicts


def judge_superiority(comparisons: Sequence[Mapping]) -> dict:
    """A against each B (``preregistered.compare`` results), wave 2's deficit rule: the weakest."""
    results = [superiority_without_deficit(c) for c in comparisons]
    return {"verdict": weakest([r["verdict"] for r in results]), "comparisons": results}


def judge_proxy(rivals: Mapping, comparisons: Mapping[str, Mapping]) -> dict:
    """A proxy claim: ``rivals`` from :func:`proxy_rivals`, ``comparisons`` per compared rival
    (``preregistered.compare`` results). No rival left: not measurable."""
    if not rivals["compared"]:
        return {"verdict": NOT_MEASURABLE, "rivals": dict(rivals)}
    judged = judge_superiority([comparisons[r] for r in rivals["compared"]])
    for row, rival in zip(judged["comparisons"], rivals["compared"]):
        row["versus"] = f"vs {rival}"
    return {**judged, "rivals": dict(rivals)}


__all__ = ["BUDGET_PROCESS_HOURS", "CLAIMS", "FIGURE_DATASETS", "FINETUNE_EPOCHS", "GROUPS",
           "INPUTS", "PROFILE", "PROXY_DATASETS", "PROXY_RIVALS", "SEEN_BEFORE_FREEZE", "WAVE", "claim",
           "expert_helps", "group", "judge_proxy", "judge_superiority", "proxy_rivals", "row_verdict", "rule_text",
           "same_outputs"]
