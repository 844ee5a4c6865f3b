"""A grid trained together (``core.train.fit_grid``), and stepped as one stacked model
(``fit_grid(stack=True)``, ``core.stacked``), against its configurations one by one.

    python benchmarks/bench_fused.py [--configs 12] [--pairs 64] [--epochs 3] [--shapes llama-3.1-8b gpt2-xl]
                                     [--layouts compact full]

For each base shape, a base-output cache of random final hidden states behind an output layer
of the paper model's exact shape (LLaMA-3.1-8B: 4,096 x 128,256, untied; GPT2-XL: 1,600 x
50,257), in the compact layout (the states; the output layer applied as batches are read) and
the full one (the log-probabilities, precomputed). The family's reweighting model (LLaMA: 1
layer, 256 wide; GPT-2: 1 layer, 768 wide) trains on synthetic pairs under the paper's grid
(lr 5e-5, 5e-4, 5e-3 x weight decay 10, 1, 0.1, 0.01: 12 configurations), with early stopping,
the three ways in one run. It prints the seconds of each, the ratio to one by one, whether each
way chooses the same configuration (lowest hyper-validation loss) and best epochs, and the
largest difference of a configuration's loss.
On a GPU (``--device cuda``) the states are in bfloat16 as the paper profile keeps them. On a
CPU the LLaMA grid's 12 models with their AdamW states take about 16 GB; the runner trains as
many together as half the memory holds (``methods.configs_at_once``). The first steps of a grid
fault in its larger working memory once: short runs understate what it saves.
Random weights and data: the numbers are speed, not quality. It runs with glibc's allocator
set as the package's training runs (``utils.malloc``).
"""
from __future__ import annotations

import argparse
import gc
import time

import torch

from plugin_lib.core.blackbox import OutputHead
from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.core.pairs import EncodedPair
from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.core.stacked import ParameterStack, stack_signature
from plugin_lib.core.train import GridRun, TokenObjective, TrainConfig, fit, fit_grid
from plugin_lib.harness import models
from plugin_lib.utils import malloc

SHAPES = {"llama-3.1-8b": ("llama-3.1-8b-twin", 4096, 128_256), "gpt2-xl": ("gpt2-xl-twin", 1600, 50_257)}
GRID = [(lr, wd) for lr in (5e-5, 5e-4, 5e-3) for wd in (10.0, 1.0, 0.1, 0.01)]


def synthetic_pairs(count: int, vocab: int, generator: torch.Generator) -> list[EncodedPair]:
    pairs = []
    for _ in range(count):
        prompt, target = int(torch.randint(8, 16, (1,), generator=generator)), int(
            torch.randint(8, 16, (1,), generator=generator))
        ids = torch.randint(3, min(vocab, 49_152), (prompt + target,), generator=generator).tolist()
        pairs.append(EncodedPair(tuple(ids), prompt))
    return pairs


def caches(pairs: list[EncodedPair], head: OutputHead, dtype: torch.dtype, device: torch.device,
           generator: torch.Generator) -> dict[str, BaseOutputCache]:
    lengths = torch.tensor([p.target_length for p in pairs])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).numpy()
    states = torch.randn(int(lengths.sum()), head.width, generator=generator).to(device, dtype)
    full = torch.cat([head.log_probs(states[i : i + 256]) for i in range(0, len(states), 256)])
    return {"compact": BaseOutputCache(states, offsets, head=head), "full": BaseOutputCache(full, offsets)}


# ATen calls that only create, reinterpret or read a tensor's metadata (no kernel on a GPU)
METADATA = {"aten::view", "aten::as_strided", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape",
            "aten::expand", "aten::t", "aten::transpose", "aten::permute", "aten::detach", "aten::detach_",
            "aten::alias", "aten::empty", "aten::empty_strided", "aten::lift_fresh", "aten::resolve_conj",
            "aten::resolve_neg", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select",
            "aten::_local_scalar_dense", "aten::item", "aten::result_type", "aten::split", "aten::unbind",
            "aten::narrow", "aten::scalar_tensor", "aten::size", "aten::stride", "aten::is_nonzero"}


def operations_per_configuration(objective: TokenObjective, grid: list[torch.nn.Module], stacked: bool) -> float:
    """The computing operations one training step dispatches per configuration (torch.profiler:
    ATen calls with no ATen call inside and not ``METADATA``, a ``_foreach_`` call counted once,
    as a GPU launches it): what a step costs where dispatching, not arithmetic, sets the pace."""
    device = next(grid[0].parameters()).device
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True) for m in grid]
    batch = objective.batch(range(min(8, len(objective))), device)
    tokens = batch["targets"].numel()
    parameters = ParameterStack(grid) if stacked else None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        if parameters is not None:
            parameters.losses_and_gradients(objective, batch)
        else:
            for model in grid:
                (objective.batch_nll(model, batch)[0] / tokens).backward()
        for optimizer in optimizers:
            optimizer.step()
    if parameters is not None:
        parameters.release()

    def inside_foreach(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::_foreach_"):
                return True
            parent = parent.cpu_parent
        return False

    calls = [e for e in profile.events() if e.name.startswith("aten::") and e.name not in METADATA
             and not inside_foreach(e)
             and (e.name.startswith("aten::_foreach_") or not any(c.name.startswith("aten::") for c in e.cpu_children))]
    return len(calls) / len(grid)


def runs(name: str, train: TokenObjective, val: TokenObjective, vocab: int, epochs: int, count: int,
         device: torch.device) -> list[GridRun]:
    arch = models.arch_for(SHAPES[name][0])
    return [GridRun(make_reweighter(vocab_size=vocab, seed=0, **arch).to(device), train, val,
                    TrainConfig(lr=lr, weight_decay=wd, max_epochs=epochs, patience=2, batch_size=8, seed=0))
            for lr, wd in GRID[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=int, default=12, help=f"at most {len(GRID)}")
    parser.add_argument("--pairs", type=int, default=64, help="training pairs (a third as many hyper-validation)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--layouts", nargs="+", default=["compact", "full"], choices=["compact", "full"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    malloc.restart_with_tunables()  # as training runs in the package: freed gradients' pages reused, not zeroed
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {device}; {args.configs} configurations, "
          f"{args.pairs} training pairs, at most {args.epochs} epochs (random weights: speed, not quality)")
    for name in args.shapes:
        _, width, vocab = SHAPES[name]
        generator = torch.Generator().manual_seed(0)
        head = OutputHead((torch.randn(vocab, width, generator=generator) / width**0.5).to(device, dtype), None)
        pairs = synthetic_pairs(args.pairs + args.pairs // 3, vocab, generator)
        built = caches(pairs, head, dtype, device, generator)
        tokens = sum(p.target_length for p in pairs)
        print(f"\n== {name}-shaped output layer ({width:,} x {vocab:,}), {tokens} target tokens")
        for layout in args.layouts:
            cache = built[layout]
            part = args.pairs
            train_cache = BaseOutputCache(cache.rows[: cache.offsets[part]], cache.offsets[: part + 1], head=cache.head)
            val_offsets = cache.offsets[part:] - cache.offsets[part]
            val_cache = BaseOutputCache(cache.rows[cache.offsets[part]:], val_offsets, head=cache.head)
            train = TokenObjective(pairs[:part], 0, cache=train_cache)
            val = TokenObjective(pairs[part:], 0, cache=val_cache)
            alone_runs = runs(name, train, val, vocab, args.epochs, args.configs, device)
            start = time.perf_counter()
            alone = [fit(r.model, r.train, r.val, r.cfg, progress=False) for r in alone_runs]
            alone_s = time.perf_counter() - start
            del alone_runs  # the models trained one by one: their memory goes back before the grid's
            gc.collect()
            malloc.release()
            timed = {}
            probe = [r.model.train() for r in runs(name, train, val, vocab, 1, args.configs, device)]
            stackable = stack_signature(probe[0]) is not None
            ops = {way: operations_per_configuration(train, probe, stacked)
                   for way, stacked in [("one by one", False)] + ([("stacked", True)] if stackable else [])}
            print(f"  {layout:7s}: operations per configuration and step: "
                  + ", ".join(f"{way} {count:,.0f}" for way, count in ops.items()))
            del probe
            for way, stack in [("together", False)] + ([("stacked", True)] if stackable else []):
                grid_runs = runs(name, train, val, vocab, args.epochs, args.configs, device)
                start = time.perf_counter()
                results = fit_grid(grid_runs, progress=False, stack=stack)
                timed[way] = (time.perf_counter() - start, results)
                del grid_runs
                gc.collect()
                malloc.release()
            chosen = min(range(len(alone)), key=lambda i: alone[i].best_val_loss)
            print(f"  {layout:7s}: one by one {alone_s:7.1f} s; chosen lr {GRID[chosen][0]:g} wd {GRID[chosen][1]:g}"
                  + ("" if stackable else f"; not stacked on {device.type}: the model draws dropout "
                                          "(core.stacked.stack_signature)"))
            for way, (seconds, results) in timed.items():
                same = chosen == min(range(len(results)), key=lambda i: results[i].best_val_loss)
                gap = max(abs(a.best_val_loss - b.best_val_loss) for a, b in zip(alone, results))
                same_epochs = all(a.best_epoch == b.best_epoch for a, b in zip(alone, results))
                print(f"           {way:8s} {seconds:7.1f} s: x{alone_s / seconds:.2f}; same choice: {same}; "
                      f"same best epochs: {same_epochs}; largest loss difference {gap:.1e}")


if __name__ == "__main__":
    main()
