"""Decoding speed of the Plugin on the offline base model; every ratio comes from this run.

    python benchmarks/bench_decode.py [--new-tokens 32] [--repeats 7] [--batches 8 32] [--plugin DIR]

Prints, for greedy decoding of real E2E prompts (all sequences forced to the same length so
both sides do the same number of steps):
  1. Plugin time / base-alone time at each batch size, the median of rounds that time the
     three in turn (bound: about 1 + the reweighting model's
     bytes read per step / the base's), with the reweighting model's output layer in float32
     (exact) and in bfloat16 (``--head-dtype bfloat16`` of generate, evaluate and serve), and
     how many of the batch's greedy outputs the two heads decode identically,
  2. KV-cached decoding vs re-running both models over the whole sequence at every step
     (the authors' approach),
  3. batched vs one-by-one throughput.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from plugin_lib import data
from plugin_lib.core.decode import generate, greedy_decode_uncached
from plugin_lib.core.reweighter import count_parameters, for_decoding, make_reweighter
from plugin_lib.data import prompts
from plugin_lib.harness.models import load_base_model


def timed(fn) -> float:
    """Wall time of one call."""
    return timed_result(fn)[0]


def timed_result(fn):
    """Wall time of one call, and its result."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=7, help="Rounds of section 1 (the median counts).")
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3], help="Which of the three to run.")
    parser.add_argument("--plugin", help="A trained artifact (plugin-repro train) whose base and reweighting model "
                                         "to decode with (default: a freshly initialised reweighting model).")
    args = parser.parse_args()
    torch.manual_seed(0)

    examples = data.load_dataset("e2e", "test", rows=max(args.batches))
    if args.plugin:
        from plugin_lib.serving import PluginModel

        adapted = PluginModel.from_pretrained(args.plugin)
        base, reweighter = adapted.base, adapted.reweighter
        texts = [adapted.format_prompt(ex.source) for ex in examples]
    else:
        base = load_base_model("smollm2-135m-instruct")
        reweighter = make_reweighter("llama", base.vocab_size, seed=0).eval()
        texts = [prompts.build_prompt("e2e", "llama", ex.source) for ex in examples]
    low_head = for_decoding(reweighter, "bfloat16")
    n = args.new_tokens
    fixed_length = dict(max_new_tokens=n, min_new_tokens=n, progress=False)
    base_params = sum(p.numel() for p in base._model.parameters())  # noqa: SLF001 - size only
    print(f"base: {base.name} ({base_params / 1e6:.0f}M parameters), reweighter: "
          f"{'trained, from ' + args.plugin if args.plugin else 'freshly initialised 1-layer LLaMA-style'} "
          f"({count_parameters(reweighter) / 1e6:.1f}M), {n} new tokens, {torch.get_num_threads()} threads")

    if 1 in args.sections:
        plugin_to_base_ratio(args, base, reweighter, low_head, texts, fixed_length)
    if 2 in args.sections or 3 in args.sections:
        cached_and_batched(args, base, reweighter, texts, fixed_length)


def plugin_to_base_ratio(args, base, reweighter, low_head, texts, fixed_length) -> None:
    print("\n1. Plugin / base-alone greedy decoding time (KV caches on both); head: the reweighting model's output layer")
    for model in (None, reweighter, low_head):  # one-time costs (lazy initialisation) out of the first round
        generate(base, texts[:2], model, batch_size=2, max_new_tokens=2, progress=False)
    for batch in args.batches:
        prompts_b = texts[:batch]
        # The three are timed in turn, one round after another, and each round gives its own
        # ratios: a drift in the machine's speed reaches the three alike. The median round counts.
        rounds, outputs = [], {}
        for _ in range(args.repeats):
            seconds = {}
            for name, model in (("base", None), ("float32", reweighter), ("bfloat16", low_head)):
                seconds[name], outputs[name] = timed_result(
                    lambda: generate(base, prompts_b, model, batch_size=batch, **fixed_length))
            rounds.append(seconds)
        same = sum(a == b for a, b in zip(outputs["float32"], outputs["bfloat16"]))
        base_s = statistics.median(r["base"] for r in rounds)
        line = [f"   batch {batch:>3}: base {base_s:6.2f} s"]
        for name in ("float32", "bfloat16"):
            ratios = [r[name] / r["base"] for r in rounds]
            line.append(f"{name} head ratio {statistics.median(ratios):.3f} "
                        f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
        print(" | ".join(line) + f" | greedy outputs of the two heads alike: {same}/{batch}")


def cached_and_batched(args, base, reweighter, texts, fixed_length) -> None:
    n = args.new_tokens
    print("\n2. KV-cached vs full re-computation at every step (Plugin, batch 8)")
    enc = base.tokenizer(texts[:8], return_tensors="pt", padding=True)
    t_cached = timed(lambda: generate(base, texts[:8], reweighter, batch_size=8, **fixed_length))
    t_full = timed(lambda: greedy_decode_uncached(
        base, enc.input_ids, enc.attention_mask, reweighter, max_new_tokens=n, min_new_tokens=n))
    print(f"   cached {t_cached:.2f} s, uncached {t_full:.2f} s, speed-up x{t_full / t_cached:.2f}")

    if 3 not in args.sections:
        return
    print("\n3. Batched vs one-by-one (Plugin, 8 prompts)")
    t_single = timed(lambda: [generate(base, [p], reweighter, batch_size=1, **fixed_length) for p in texts[:8]])
    print(f"   batch 8 {t_cached:.2f} s, one-by-one {t_single:.2f} s, throughput x{t_single / t_cached:.2f}")


if __name__ == "__main__":
    main()
