"""glibc's default allocator against the settings of plugin_lib/utils/malloc.py, on the Plugin's
CPU work; every ratio comes from this run.

    python benchmarks/bench_malloc.py [--pairs 48] [--epochs 2] [--decode 16] [--rounds 2]

Each round runs the same child process under both settings, alternating: it builds the base-output
cache, trains a 1-layer reweighter and decodes with the Plugin (E2E, one thread). Printed per
setting: wall and CPU seconds (user, system), minor page faults and peak memory; then the ratios,
and whether both settings gave bitwise the same weights and texts (they must).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time

from plugin_lib.utils import malloc


def child(pairs: int, epochs: int, decode: int) -> dict:
    import torch

    from plugin_lib import data
    from plugin_lib.core.decode import generate
    from plugin_lib.core.reweighter import make_reweighter
    from plugin_lib.core.cache import BaseOutputCache
    from plugin_lib.core.pairs import encode_pairs
    from plugin_lib.core.train import TokenObjective, TrainConfig, fit
    from plugin_lib.data import prompts
    from plugin_lib.harness.models import load_base_model

    torch.manual_seed(0)
    base = load_base_model("smollm2-135m-instruct")
    train_pairs = data.training_pairs(data.load_dataset("e2e", "validation", rows=pairs))[:pairs]
    encoded = encode_pairs(base.tokenizer, [prompts.build_prompt("e2e", "llama", e.source) for e, _ in train_pairs],
                           [ref for _, ref in train_pairs])
    test = [prompts.build_prompt("e2e", "llama", e.source) for e in data.load_dataset("e2e", "test", rows=decode)]
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pad = base.tokenizer.pad_token_id
    train = TokenObjective(encoded, pad, cache=BaseOutputCache.build(base, encoded, progress=False))
    val = TokenObjective(encoded[:16], pad, cache=BaseOutputCache.build(base, encoded[:16], progress=False))
    model = make_reweighter("llama", base.vocab_size, seed=0)
    fit(model, train, val, TrainConfig(lr=5e-4, max_epochs=epochs, patience=epochs, batch_size=8), progress=False)
    texts = generate(base, test, model.eval(), batch_size=16, max_new_tokens=64, progress=False)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "system": after.ru_stime - before.ru_stime,
            "faults": after.ru_minflt - before.ru_minflt, "peak_mib": after.ru_maxrss / 1024,
            "digest": hashlib.sha256(weights + "\n".join(texts).encode()).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--decode", type=int, default=16, help="test prompts decoded with the Plugin")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.pairs, args.epochs, args.decode)))
        return

    base_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    base_env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    settings = {"glibc default": base_env, "utils.malloc": {**base_env, "GLIBC_TUNABLES": malloc.TUNABLES}}
    command = [sys.executable, __file__, "--child", "--pairs", str(args.pairs), "--epochs", str(args.epochs),
               "--decode", str(args.decode)]
    results: dict[str, list[dict]] = {name: [] for name in settings}
    for round_ in range(1, args.rounds + 1):
        for name, env in settings.items():
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_}, {name}: {results[name][-1]['wall']:.1f} s", file=sys.stderr)

    def best(name: str, key: str) -> float:  # the least disturbed round
        return min(r[key] for r in results[name])

    print(f"{args.pairs} E2E pairs x {args.epochs} epochs, then {args.decode} prompts decoded with the Plugin; "
          f"one thread; best of {args.rounds} rounds")
    print(f"{'setting':>14} {'wall s':>7} {'user s':>7} {'system s':>9} {'faults':>10} {'peak MiB':>9}")
    for name in settings:
        print(f"{name:>14} {best(name, 'wall'):7.1f} {best(name, 'user'):7.1f} {best(name, 'system'):9.1f} "
              f"{best(name, 'faults'):10.0f} {best(name, 'peak_mib'):9.0f}")
    default, tuned = settings
    cpu = {n: min(r["user"] + r["system"] for r in results[n]) for n in settings}
    print(f"\nwall time, default / tuned:  x{best(default, 'wall') / best(tuned, 'wall'):.2f}")
    print(f"CPU time, default / tuned:   x{cpu[default] / cpu[tuned]:.2f}")
    print(f"peak memory, tuned / default: x{best(tuned, 'peak_mib') / best(default, 'peak_mib'):.2f}")
    digests = {r["digest"] for rs in results.values() for r in rs}
    print(f"weights and texts bitwise equal across settings and rounds: {len(digests) == 1}")


if __name__ == "__main__":
    main()
