"""Training from the compact base-output cache against the full one, on this machine's CPU.

    python benchmarks/bench_cache.py [--model smollm2-135m-instruct] [--pairs 96] [--epochs 2]

The same 1-layer reweighting model trains for the same epochs on the same E2E pairs from three
caches of the frozen base (``core.cache``), all built here in one run:

  full, in memory  : log-probabilities, V values a target token (the local profile's layout);
  full, mapped     : the same rows memory-mapped from a file on disk;
  compact          : the base's final hidden states (d values a token), turned into the same
                     log-probabilities by its output layer as each batch is read.

It prints each cache's size and build time, training pairs per second, the ratios, and how far
the compact cache's hyper-validation loss is from the full one's (exactness). The layout rule
(``core.cache.choose_layout``) keeps the full cache on a CPU where it fits memory: the ratio
printed here is why.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch

from plugin_lib import data
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit
from plugin_lib.data import prompts
from plugin_lib.harness import models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--pairs", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = models.load_base_model(args.model, dtype="float32", device="cpu")
    spec = models.model_spec(args.model)
    examples = data.load_dataset("e2e", "validation", rows=args.pairs)
    chosen = data.training_pairs(examples)[: args.pairs]
    texts = [prompts.format_for_model(prompts.build_prompt("e2e", spec["family"], ex.source), base.tokenizer,
                                      spec.get("chat_template", False)) for ex, _ in chosen]
    pairs = encode_pairs(base.tokenizer, texts, [reference for _, reference in chosen])
    train, val = pairs[: len(pairs) * 3 // 4], pairs[len(pairs) * 3 // 4 :]
    pad = base.tokenizer.pad_token_id
    print(f"{spec['display']} on CPU ({torch.get_num_threads()} threads), {len(train)} training and {len(val)} "
          f"hyper-validation E2E pairs, {args.epochs} epochs, torch {torch.__version__}")

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        layouts = {"full, in memory": dict(layout="full", placement="memory"),
                   "full, mapped": dict(layout="full", directory=f"{folder}/full"),
                   "compact": dict(layout="compact", placement="memory")}
        for label, how in layouts.items():
            started = time.perf_counter()
            caches = [BaseOutputCache.build(base, part, progress=False, **how) for part in (train, val)]
            built = time.perf_counter() - started
            reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(args.model))
            objectives = [TokenObjective(part, pad, cache=cache) for part, cache in zip((train, val), caches)]
            result = fit(reweighter, *objectives, TrainConfig(lr=1e-3, max_epochs=args.epochs, patience=args.epochs),
                         progress=False)
            results[label] = (sum(c.nbytes for c in caches), built, len(train) * result.epochs_run / result.seconds,
                              result.best_val_loss)
            size, built, rate, loss = results[label]
            print(f"  {label:<16} {size / 2**20:9.2f} MiB, built in {built:5.1f} s, training {rate:6.2f} pairs/s, "
                  f"hyper-validation loss {loss:.6f}")
    full_size, _, full_rate, full_loss = results["full, in memory"]
    _, _, mapped_rate, _ = results["full, mapped"]
    size, _, rate, loss = results["compact"]
    print(f"compact / full in memory: training time x{full_rate / rate:.2f}, size 1/{full_size / size:,.0f}; "
          f"compact / full mapped: training time x{mapped_rate / rate:.2f}; loss difference {abs(loss - full_loss):.2e}")


if __name__ == "__main__":
    main()
