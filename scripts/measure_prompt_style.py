"""What the profile's ``prompts`` setting changes: Zeroshot with the authors' prompt strings and
with the paper's appendix texts, on the same hyper-validation inputs of each dataset (never the
test set), for one base model in one profile's format and decoding. Writes the table
``prompt_style`` (CSV, Markdown, LaTeX) under ``results/<profile>/tables/`` and prints it.

    python scripts/measure_prompt_style.py [--profile local] [--rows 40] [--outputs FILE]

The inputs are the first ``rows`` of the hyper-validation part of the profile's validation
subset (``tasks.task_splits``: what the profile's runs stop early on). The ICL scheme, the
other half of the setting, is not measured here: the authors draw demonstrations from the whole
validation split, hyper-validation included, so ICL on these inputs could see their references.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from plugin_lib.data import DATASETS
from plugin_lib.harness import methods, models, tasks
from plugin_lib.harness.models import load_base_model
from plugin_lib.harness.profile import load_profile
from plugin_lib.metrics import compute_metrics
from plugin_lib.report import writer
from plugin_lib.report.stats import paired_bootstrap
from plugin_lib.utils.io import atomic_write_text

METRICS = ("BLEU", "ROUGE-1", "ROUGE-L", "METEOR", "CIDEr")
TESTED = ("BLEU", "ROUGE-1")  # paired bootstrap without Java (report.stats.BOOTSTRAP_METRICS)


def two_sided_p(a: list[str], b: list[str], references: list[list[str]], resamples: int) -> dict[str, float]:
    """Two-sided paired-bootstrap p-values of A against B: twice the smaller one-sided one."""
    a_not_better = paired_bootstrap(a, b, references, TESTED, resamples)
    b_not_better = paired_bootstrap(b, a, references, TESTED, resamples)
    return {m: min(1.0, 2 * min(a_not_better[m], b_not_better[m])) for m in TESTED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="local", help="its first base model, decoding and token limits")
    parser.add_argument("--rows", type=int, default=40, help="hyper-validation inputs per dataset")
    parser.add_argument("--resamples", type=int, default=1000, help="paired-bootstrap resamples")
    parser.add_argument("--outputs", type=Path, help="also write every prompt and output as JSON here")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    model = profile.base_models[0]
    spec = models.model_spec(model)
    base = load_base_model(model, dtype=profile.dtype)
    rows, outputs = [], {}
    for dataset in DATASETS:
        _, hyper, _ = tasks.task_splits(dataset, profile)
        inputs = hyper[: args.rows]
        references = [list(ex.references) for ex in inputs]
        predictions = {}
        for style in ("appendix", "authors"):
            task = tasks.Task(base, dataset, spec["family"], train=[], hyper=[], test=inputs,
                                max_prompt_tokens=profile.tokens.max_prompt,
                                use_chat_template=spec.get("chat_template", False), prompt_style=style)
            texts = [task.prompt(ex) for ex in inputs]
            predictions[style] = methods.predict(task, "Zeroshot", None, profile.seeds[0], profile.decoding,
                                                 progress=False)
            lengths = [len(ids) for ids in base.tokenizer(texts)["input_ids"]]
            rows.append({"dataset": dataset, "prompts": style, **compute_metrics(predictions[style], references, METRICS),
                         "empty outputs": float(np.mean([not p.strip() for p in predictions[style]])),
                         "prompt tokens": float(np.mean(lengths)), "inputs": len(inputs)})
            outputs[f"{dataset}/{style}"] = [{"id": ex.id, "prompt": text, "output": out}
                                             for ex, text, out in zip(inputs, texts, predictions[style])]
            print(rows[-1], flush=True)
        p_values = two_sided_p(predictions["authors"], predictions["appendix"], references, args.resamples)
        rows[-1].update({f"p {m}": p for m, p in p_values.items()})
    table = pd.DataFrame(rows)
    caption = (f"Zeroshot of {spec.get('display', model)} ({args.profile} profile's format and decoding) with the "
               f"authors' prompt strings and the paper's appendix texts, on {args.rows} hyper-validation inputs "
               "per dataset (never the test set). p: two-sided paired bootstrap of authors against appendix "
               f"({args.resamples} resamples).")
    shown = table.copy()
    for column in [*METRICS, "empty outputs", *(f"p {m}" for m in TESTED)]:
        shown[column] = shown[column].map(lambda v: "--" if pd.isna(v) else f"{v:.4f}")
    shown["prompt tokens"] = shown["prompt tokens"].map("{:.0f}".format)
    writer.save_table(table, "prompt_style", profile, caption, markdown=shown.to_markdown(index=False, disable_numparse=True) + "\n")
    if args.outputs:
        atomic_write_text(args.outputs, json.dumps(outputs, indent=1, ensure_ascii=False))
    print(shown.to_markdown(index=False, disable_numparse=True))


if __name__ == "__main__":
    main()
