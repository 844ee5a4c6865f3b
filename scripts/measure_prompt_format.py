"""Which prompt format should the offline SmolLM2-Instruct base use: the paper's LLaMA-family
prompt as plain text, or wrapped in the model's chat template? Measured by Zeroshot on the
hyper-validation part of each dataset (never the test set); prints one row per dataset.
The table in docs/data.md was measured with the appendix prompts (the default here).

    python scripts/measure_prompt_format.py [--rows 40] [--prompts appendix|authors]
"""
from __future__ import annotations

import argparse

import pandas as pd

from plugin_lib import data
from plugin_lib.data import prompts
from plugin_lib.harness import methods, tasks
from plugin_lib.harness.models import load_base_model
from plugin_lib.harness.profile import load_profile
from plugin_lib.metrics import compute_metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=40, help="hyper-validation inputs per dataset")
    parser.add_argument("--prompts", choices=prompts.STYLES, default="appendix", help="the prompt style")
    args = parser.parse_args()
    base = load_base_model("smollm2-135m-instruct")
    decoding = load_profile("local").decoding
    rows = []
    for dataset in ("e2e", "webnlg", "commongen", "adidas"):
        _, hyper = data.split_hyper_validation(data.load_dataset(dataset, "validation"), seed=0)
        task = tasks.Task(base, dataset, "llama", train=[], hyper=[], test=hyper[: args.rows],
                            prompt_style=args.prompts)
        for chat in (False, True):
            task.use_chat_template = chat
            outputs = methods.predict(task, "Zeroshot", None, 0, decoding, progress=False)
            scores = compute_metrics(outputs, [list(ex.references) for ex in task.test], ["BLEU", "ROUGE-L"])
            empty = sum(not o for o in outputs) / len(outputs)
            rows.append({"dataset": dataset, "chat_template": chat, **scores, "empty_outputs": empty})
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f"))


if __name__ == "__main__":
    main()
