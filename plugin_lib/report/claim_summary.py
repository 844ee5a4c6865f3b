"""A judged claim in words: what each comparison compares (``versus_labels``), the comparison
that sets the verdict (``weakest_comparison``), and the one line of effect, p-value or interval,
and n that the README and REPORT.md show (``summary``). Every wave's judging uses it."""
from __future__ import annotations

import re
from collections.abc import Sequence

from . import preregistered as pre
from .claims import n_seeds


def _base_label(model: str) -> str:
    """A run folder's base, briefly: "original", "fine-tuned 5 ep", "top5-residual"."""
    if "@" in model:
        return model.split("@", 1)[1]
    tuned = re.search(r"-(\d+)ep$", model)
    return f"fine-tuned {tuned.group(1)} ep" if tuned else "original"


def versus_labels(pairs: Sequence[tuple[list[dict], list[dict]]]) -> list[str]:
    """What each comparison of a claim compares, by what varies among them: "vs ICL-1" (the
    baselines), "Plugin-2L vs Plugin" (the models compared), "on fine-tuned 5 ep" (the bases)."""
    a_methods = {a[0]["method"] for a, _ in pairs}
    models = {a[0]["model"] for a, _ in pairs}
    labels = []
    for a, b in pairs:
        first, second = a[0], b[0]
        if first["model"] != second["model"]:
            labels.append(f"{first['method']} on {_base_label(first['model'])} vs on {_base_label(second['model'])}")
        elif len(a_methods) > 1:
            labels.append(f"{first['method']} vs {second['method']}")
        elif len(models) > 1:
            labels.append(f"on {_base_label(first['model'])}")
        else:
            labels.append(f"vs {second['method']}")
    return labels


# What each test's Holm-adjusted p-value on a comparison is the p-value of.
P_LABELS = {"superiority": "Holm p", "non-superiority": "Holm p of better by the margin",
            "equivalence": "Holm p of TOST"}


def weakest_comparison(c: pre.Claim, rows: Sequence[dict]) -> dict:
    """The comparison that sets a claim's verdict: the weakest verdict, then the largest BLEU
    p-value, then the effect furthest from the claim (smallest gain; largest gain or gap)."""
    verdict = pre.weakest([r["verdict"] for r in rows])
    candidates = [r for r in rows if r["verdict"] == verdict] or list(rows)

    def weakness(r: dict) -> tuple[float, float]:
        gain = r["difference"]["BLEU"]
        return r["p (Holm)"]["BLEU"], -gain if c.test == "superiority" else abs(gain)

    return max(candidates, key=weakness)


def p_text(p: float) -> str:
    """A p-value to three decimals; one that rounds to 0 as "< 0.001", not "0.000"."""
    return "< 0.001" if p < 0.0005 else f"{p:.3f}"


def summary(c: pre.Claim, result: dict) -> str:
    """One line: the effect, its p-value or interval, and n."""
    n = result.get("n") or (result.get("comparisons") or [{}])[0].get("n") or {}
    scale = ", ".join(([f"{n['inputs']} inputs"] if n.get("inputs") is not None else [])
                      + ([n_seeds(n["seeds"])] if n.get("seeds") is not None else []))
    if result["verdict"] == pre.NOT_MEASURABLE and "premise" in result:
        return f"premise fails: {_premise_line(result['premise'])}"
    if "comparisons" in result:
        rows = result["comparisons"]
        shown = weakest_comparison(c, rows)
        line = (f"BLEU {shown['difference']['BLEU']:+.4f} ({P_LABELS.get(c.test, 'Holm p')} "
                f"{p_text(shown['p (Holm)']['BLEU'])})")
        where = [f"weakest of {len(rows)}"] if len(rows) > 1 else []
        where += [shown["versus"]] if shown.get("versus") else []
        head = f"{', '.join(where)}: " if where else ""
        return f"{head}{line}; {scale}"
    if "difference" in result:
        return f"share {result['difference']:+.3f} (p {p_text(result['p'])}, 95% CI {result['ci95'][0]:+.3f}..{result['ci95'][1]:+.3f}); {scale}"
    if "inputs favouring A" in result:
        return f"{result['inputs favouring A']} vs {result['inputs favouring B']} inputs (sign test p {p_text(result['p'])}); {scale}"
    if "plugin_flops" in result:
        return f"{result['plugin_flops'] / 1e9:.1f} / {result['lora_flops'] / 1e9:.1f} GFLOPs (exact)"
    if "slope" in result:
        return f"slope {result['slope']:.3f} (95% CI {result['ci95'][0]:.3f}..{result['ci95'][1]:.3f}); {scale}"
    return f"narrowest std on {len(result.get('narrowest on', []))}/7 metrics; {scale}"


def _premise_line(found: dict) -> str:
    if "per seed" in found:
        return "; ".join(f"seed {s['seed']}: gain {s['gain']:+.3f}, top probability x C {s['concentration']:.2f}"
                         for s in found["per seed"])
    if "reference share" in found and found.get("share") is not None:
        return f"target share {found['share']:.1%} vs references {found['reference share']:.1%} (p {p_text(found['p'])})"
    return found.get("why") or f"verdict {found.get('verdict')}"
