"""The paper profile's speed on a GPU, measured on the full-size shape twins of its bases.

    python benchmarks/bench_gpu.py [--models gpt2-xl-twin llama-3.1-8b-twin] [--new-tokens 64]
    python benchmarks/bench_gpu.py --cpu     # the small twins on a CPU: checks this script only

Twins have the paper models' exact architectures and random weights (twin: says nothing about
the paper's numbers), in the dtype the run would load them in (``harness.models.resolve_dtype``:
GPT-2 float16, LLaMA-3.1-8B bfloat16 where the GPU supports it). Prompts are E2E's (from
PLUGIN_DATA_DIR; a fixed list without it). Prints, per base:

  1. Plugin time / base-alone time, greedy, 64 new tokens, repetition penalty 1.1, at batch
     8 and 32 (every sequence forced to the same length, so both do the same steps);
  2. KV-cached vs re-running the whole sequence at every step (the authors' loop), batch 8;
  3. base-output cache build rate at batch 8 (pairs/s) and its size per target token, full
     (log-probabilities) and compact (final hidden states; core.cache);
  4. Plugin training rate (pairs/s) from the full cache on the GPU, in pinned host memory and
     memory-mapped from disk, and from the compact cache on the GPU (the paper profile's
     layout), in one run;
  5. for the bases of ``--graphs-models`` (the LLaMA-8B twin), decoding at the largest batch from
     static KV caches, the steps compiled and replayed as CUDA graphs (``core.decode``'s
     ``static_cache``), against the dynamic cache: Plugin/base with and without, the speed-up
     of each, and the share of rows whose tokens are the same.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from plugin_lib.core.decode import STATIC_PAD, PluginLogitsProcessor, compiled_step, greedy_decode_uncached
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.cache import BaseOutputCache, release_gpu_caches
from plugin_lib.core.pairs import encode_pairs
from plugin_lib.core.train import TokenObjective, TrainConfig, fit
from plugin_lib.data import prompts
from plugin_lib.harness import models

FALLBACK_PROMPTS = [
    "name[The Eagle], eatType[coffee shop], food[French], priceRange[moderate], area[riverside]",
    "name[Aromi], eatType[restaurant], food[Chinese], customer rating[low], area[city centre]",
    "name[The Punter], priceRange[cheap], customer rating[average], familyFriendly[yes]",
    "name[Zizzi], eatType[pub], food[Italian], near[The Sorrento]",
]


def e2e_pairs(count: int) -> tuple[list[str], list[str]]:
    """(source, reference) pairs of E2E's validation split, or a fixed list without data."""
    try:
        from plugin_lib import data

        examples = data.load_dataset("e2e", "validation", rows=count)
        pairs = data.training_pairs(examples)[:count]
        return [ex.source for ex, _ in pairs], [ref for _, ref in pairs]
    except Exception:  # no data folder and no Hub: the fixed prompts, repeated
        sources = [FALLBACK_PROMPTS[i % len(FALLBACK_PROMPTS)] for i in range(count)]
        return sources, [f"{s.split(']')[0].split('[')[1]} is a place to eat." for s in sources]


def task_prompt(name: str, tokenizer, source: str) -> str:
    """E2E's prompt in the model family's wording and format (the runner's ``Task.prompt``)."""
    spec = models.model_spec(name)
    text = prompts.build_prompt("e2e", spec["family"], source)
    return prompts.format_for_model(text, tokenizer, spec.get("chat_template", False))


def timed(fn, repeats: int = 2) -> float:
    """Best wall time of ``repeats`` calls after one warm-up, with the GPU synchronised."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def decode(base, reweighter, enc, new_tokens, penalty=1.1, static=False, step=None):
    length = enc.input_ids.shape[1] + new_tokens
    processors = [PluginLogitsProcessor(reweighter, enc.attention_mask, repetition_penalty=penalty,
                                        static_length=length if static else None, step=step)] if reweighter else []
    kwargs = {} if reweighter else {"repetition_penalty": penalty}
    if static:
        kwargs["cache_implementation"] = "static"  # transformers compiles the base's step on a GPU
    return base.generate(enc.input_ids, enc.attention_mask, logits_processor=processors, do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         pad_token_id=base.tokenizer.pad_token_id, **kwargs)


def static_decoding(base, reweighter, texts, batch, n, repeats, device) -> None:
    """Section 5: static caches (CUDA graphs on a GPU) against the dynamic cache."""
    enc = base.tokenizer(texts[:batch], return_tensors="pt", padding=True, pad_to_multiple_of=STATIC_PAD)
    step = compiled_step(reweighter) if device.type == "cuda" else None
    started = time.perf_counter()
    static_ids = decode(base, reweighter, enc, n, static=True, step=step)  # compiles, then records the graphs
    first = time.perf_counter() - started
    t = {}
    for static in (False, True):
        t[static, "base"] = timed(lambda: decode(base, None, enc, n, static=static), repeats)
        t[static, "Plugin"] = timed(lambda: decode(base, reweighter, enc, n, static=static,
                                                   step=step if static else None), repeats)
    same = (static_ids == decode(base, reweighter, enc, n)).all(1).float().mean().item()
    what = "static caches and CUDA graphs" if device.type == "cuda" else "static caches (a CPU: no graphs)"
    print(f"5. {what}, batch {batch}: Plugin/base {t[True, 'Plugin'] / t[True, 'base']:.3f} with, "
          f"{t[False, 'Plugin'] / t[False, 'base']:.3f} without; base x{t[False, 'base'] / t[True, 'base']:.2f}, "
          f"Plugin x{t[False, 'Plugin'] / t[True, 'Plugin']:.2f} faster with; {same:.0%} of {batch} rows the same "
          f"tokens both ways; the first call, compiling, {first:.0f} s")


def bench(name: str, args) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    base = models.load_base_model(name, dtype="auto", device=device)
    spec = models.model_spec(name)
    params = sum(p.numel() for p in base._model.parameters())  # noqa: SLF001 - size only
    reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(name)).to(device).eval()
    sources, references = e2e_pairs(max(args.batches + [args.train_pairs]))
    texts = [task_prompt(name, base.tokenizer, s) for s in sources]
    n = args.new_tokens
    print(f"\n== {spec['display']}: {params / 1e9:.2f}B parameters, {base.dtype}, vocabulary {base.vocab_size}, "
          f"on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}")

    print(f"1. Plugin / base alone, greedy, {n} new tokens, repetition penalty 1.1")
    for batch in args.batches:
        enc = base.tokenizer(texts[:batch], return_tensors="pt", padding=True)
        t_base = timed(lambda: decode(base, None, enc, n), args.repeats)
        t_plugin = timed(lambda: decode(base, reweighter, enc, n), args.repeats)
        print(f"   batch {batch:>3}: base {t_base:6.2f} s, Plugin {t_plugin:6.2f} s, ratio {t_plugin / t_base:.3f}")

    enc = base.tokenizer(texts[:8], return_tensors="pt", padding=True)
    t_cached = timed(lambda: decode(base, reweighter, enc, n), 1)
    t_full = timed(lambda: greedy_decode_uncached(base, enc.input_ids, enc.attention_mask, reweighter,
                                                  max_new_tokens=n, min_new_tokens=n, repetition_penalty=1.1), 1)
    print(f"2. KV-cached {t_cached:.2f} s vs uncached {t_full:.2f} s at batch 8: x{t_full / t_cached:.2f}")

    prompt_texts = texts[: args.train_pairs]
    pairs = encode_pairs(base.tokenizer, prompt_texts, references[: args.train_pairs])
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        cache = BaseOutputCache.build(base, pairs, placement="memory", layout="full", progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        build = time.perf_counter() - started
        where = "gpu" if device.type == "cuda" else "memory"
        started = time.perf_counter()
        compact = BaseOutputCache.build(base, pairs, placement=where, layout="compact", progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        build_compact = time.perf_counter() - started
        tokens = cache.rows.shape[0]
        print(f"3. cache build: full {len(pairs) / build:,.1f} pairs/s, {cache.nbytes / tokens / 1024:,.1f} KB per "
              f"target token ({cache.dtype}); compact {len(pairs) / build_compact:,.1f} pairs/s, "
              f"{compact.nbytes / tokens / 1024:,.1f} KB ({compact.dtype}), x{cache.nbytes / compact.nbytes:,.0f} "
              f"smaller; {tokens:,} target tokens at batch 8")
        mapped = BaseOutputCache.build(base, pairs, directory=folder, placement="mmap", layout="full", progress=False)
        placements = {"memory-mapped": mapped}
        if device.type == "cuda":
            placements = {"GPU": mapped.placed("gpu", device), "pinned host": mapped.placed("pinned"), **placements}
        placements["compact"] = compact
        rates = {}
        for label, where in placements.items():
            pad = base.tokenizer.pad_token_id
            objective = TokenObjective(pairs, pad, cache=where)
            few = TokenObjective(pairs[:8], pad, cache=BaseOutputCache(where.rows[: where.offsets[8]],
                                                                       where.offsets[:9], where.placement, where.head))
            model = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(name)).to(device)
            cfg = TrainConfig(lr=1e-4, max_epochs=1, batch_size=8)
            fit(model, few, few, cfg, progress=False)  # warm-up
            result = fit(model, objective, few, cfg, progress=False)  # one epoch; validation on 8 pairs
            rates[label] = len(pairs) / result.seconds
        print("4. training: " + ", ".join(f"{label} {rate:,.0f} pairs/s" for label, rate in rates.items())
              + (f" (full on the GPU / memory-mapped x{rates['GPU'] / rates['memory-mapped']:.2f})" if "GPU" in rates
                 else "")
              + f" (compact / memory-mapped x{rates['compact'] / rates['memory-mapped']:.2f})")
        del placements, mapped, cache, compact
    release_gpu_caches()
    if name in args.graphs_models:
        static_decoding(base, reweighter, texts, max(args.batches), n, args.repeats, device)
    del base, reweighter
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt2-xl-twin", "llama-3.1-8b-twin"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--train-pairs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--graphs-models", nargs="*", default=["llama-3.1-8b-twin"],
                        help="bases timed with static caches and CUDA graphs too (section 5; each compiles)")
    parser.add_argument("--static-only", action="store_true",
                        help="only section 5 (static caches and CUDA graphs), on --graphs-models")
    parser.add_argument("--cpu", action="store_true",
                        help="run the small twins on the CPU (checks the script; the numbers mean nothing for a GPU)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print("bench_gpu.py measures the paper's bases on a CUDA GPU, and this machine has none. Run it on a GPU "
              "machine, or pass --cpu to run the small twins here (a check of the script, not a measurement).")
        return 0
    if args.cpu:
        args.models = [m if m.endswith("-small") else f"{m}-small" for m in args.models]
        args.graphs_models = [m if m.endswith("-small") else f"{m}-small" for m in args.graphs_models]
        args.new_tokens, args.batches, args.train_pairs, args.repeats = 8, [2, 4], 16, 1
    print(f"Shape twins ({models.TWIN_LABEL}); torch {torch.__version__}")
    torch.manual_seed(0)
    if args.static_only:
        device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
        for name in args.graphs_models:
            base = models.load_base_model(name, dtype="auto", device=device)
            reweighter = make_reweighter(vocab_size=base.vocab_size, seed=0, **models.arch_for(name)).to(device).eval()
            sources, _ = e2e_pairs(max(args.batches))
            print(f"\n== {models.model_spec(name)['display']}, {base.dtype}")
            static_decoding(base, reweighter, [task_prompt(name, base.tokenizer, s) for s in sources],
                            max(args.batches), args.new_tokens, args.repeats, device)
        return 0
    for name in args.models:
        bench(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
