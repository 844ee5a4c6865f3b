"""Training throughput of a Plugin reweighting model on the offline base, in (prompt, reference)
pairs per second, and what each speed-up contributes. All ratios come from this one run.

    python benchmarks/bench_train.py [--pairs 64] [--epochs 2]

Variants (each trains the same 1-layer LLaMA-style reweighter for the same epochs):
  recompute : re-run the frozen base on every batch, output head at every position, fp32
  cache     : base outputs from BaseOutputCache, head at every position, fp32
  targets   : cache, head only at target positions, fp32 (the default)
  bf16      : as targets, small model under bfloat16 autocast (combination and loss in fp32)
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from plugin_lib import data
from plugin_lib.core.loss import shift_labels, target_positions
from plugin_lib.core.reweighter import make_reweighter, reweighter_logits
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import collate, encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit
from plugin_lib.data import prompts
from plugin_lib.harness.models import load_base_model


class HeadEverywhere(TokenObjective):
    """Computes the small model's output head at every position, then keeps the targets.

    It overrides ``batch_nll``, the step ``fit`` takes on each batch (``nll`` is not called in
    training), so the variant is measured, not the default."""

    def batch_nll(self, model, batch):
        small = reweighter_logits(model, batch["input_ids"], batch["attention_mask"])[batch["positions"]]
        loss = F.nll_loss(self.log_probs(batch["base"], small), batch["targets"], reduction="sum")
        return loss, batch["targets"].numel()


class RecomputeBase(HeadEverywhere):
    """Re-runs the frozen base model on every batch instead of reading the cache."""

    base = None

    def batch(self, indices, device):
        batch = {k: v.to(device) for k, v in collate([self.pairs[i] for i in indices], self.pad_token_id).items()}
        positions = target_positions(batch["labels"])
        with torch.no_grad():
            logits = self.base.logits(batch["input_ids"], batch["attention_mask"])[positions]
        return {**batch, "positions": positions, "targets": shift_labels(batch["labels"])[positions],
                "base": F.log_softmax(logits.float(), -1).to(device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)

    base = load_base_model("smollm2-135m-instruct")
    examples = data.load_dataset("e2e", "validation", rows=args.pairs)
    train_pairs = data.training_pairs(examples)[: args.pairs]
    texts = [prompts.build_prompt("e2e", "llama", ex.source) for ex, _ in train_pairs]
    pairs = encode_pairs(base.tokenizer, texts, [ref for _, ref in train_pairs])
    val_pairs = pairs[:16]
    print(f"{len(pairs)} E2E pairs, mean prompt {sum(p.prompt_length for p in pairs) / len(pairs):.0f} "
          f"tokens, mean target {sum(p.target_length for p in pairs) / len(pairs):.0f} tokens")

    t0 = time.perf_counter()
    cache = BaseOutputCache.build(base, pairs, progress=False)
    val_cache = BaseOutputCache.build(base, val_pairs, progress=False)
    print(f"base-output cache built once in {time.perf_counter() - t0:.1f} s ({cache.nbytes / 2**20:.0f} MiB)")

    pad = base.tokenizer.pad_token_id
    val = TokenObjective(val_pairs, pad, cache=val_cache)
    recompute = RecomputeBase(pairs, pad, cache=cache)
    recompute.base = base
    variants = {
        "recompute": (recompute, None),
        "cache": (HeadEverywhere(pairs, pad, cache=cache), None),
        "targets": (TokenObjective(pairs, pad, cache=cache), None),
        "bf16": (TokenObjective(pairs, pad, cache=cache), "bfloat16"),
    }
    rates, losses = {}, {}
    for name, (objective, autocast) in variants.items():
        model = make_reweighter("llama", base.vocab_size, seed=0)
        cfg = TrainConfig(lr=5e-4, max_epochs=args.epochs, patience=args.epochs, batch_size=8, autocast=autocast)
        start = time.perf_counter()
        result = fit(model, objective, val, cfg, progress=False)
        seconds = time.perf_counter() - start
        rates[name] = len(pairs) * result.epochs_run / seconds
        losses[name] = result.best_val_loss
        print(f"{name:>10}: {rates[name]:6.1f} pairs/s   hyper-val loss {result.best_val_loss:.4f}")

    print(f"\nbase-output cache vs recomputing the base per epoch: x{rates['cache'] / rates['recompute']:.2f}")
    print(f"head only at target positions:                     x{rates['targets'] / rates['cache']:.2f}")
    print(f"bfloat16 autocast on top:                          x{rates['bf16'] / rates['targets']:.2f}")
    print(f"all together vs recompute:                         x{rates['bf16'] / rates['recompute']:.2f}")
    print(f"hyper-val loss, bf16 minus fp32:                   {losses['bf16'] - losses['targets']:+.4f}")


if __name__ == "__main__":
    main()
