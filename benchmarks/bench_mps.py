"""Several trainings on one GPU with and without CUDA MPS, on the paper preflight's own shapes.

    python benchmarks/bench_mps.py [--models llama-3.1-8b gpt2-xl] [--counts 8 12 4] [--steps 100] [--out mps.json]
    python benchmarks/bench_mps.py --cpu     # paper-twin's small shapes at 2 at once: checks this script only

Without MPS the GPU runs the kernels of several processes in turns; with it, side by side. For
each model, k processes train its reweighting model from a compact cache at once
(``harness.planning.shared_rates``, as ``--save-rates`` measures the concurrency curve), first
as plain processes, then as clients of a private MPS daemon (``mps_server``: its own folders,
quit after each count; nothing else on the machine changes). Prints, per model and count: the
aggregate pairs/s of each, MPS/plain measured in the same run, and whether every process ended
with the weights of the one process that trained alone (the plan may price only an exact
curve). ``--out`` is rewritten after each count, so a run cut short keeps what it measured.
Where there is no MPS (no CUDA GPU, no ``nvidia-cuda-mps-control``, or a daemon that does not
start), the plain curve is measured alone and the JSON says why.
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

import torch

from plugin_lib.harness import profile as config
from plugin_lib.harness.planning import concurrency
from plugin_lib.harness.planning.preflight_counts import count_task
from plugin_lib.harness.planning.preflight_rates import shared_shape
from plugin_lib.harness.planning.shared_rates import aggregate_rate, at_once, mps_control, mps_server
from plugin_lib.utils.io import atomic_write_json


def measure(model: str, profile: config.Profile, device: torch.device, counts: list[int], steps: int,
            control: str | None, record: dict, out: Path | None) -> None:
    """``model``'s rows of ``record`` (module docstring), each printed and written as it is measured."""
    shape = shared_shape(model, profile, count_task("e2e", model, profile), device)
    alone = at_once(shape, 1, steps)[0]
    rows = record["models"].setdefault(model, {"shape": dataclasses.asdict(shape), "counts": {}})["counts"]
    for k in counts:
        plain = [alone] if k == 1 else at_once(shape, k, steps)
        row = {"plain_pairs_per_s": aggregate_rate(plain, steps, shape.batch_size), "mps_pairs_per_s": None,
               "digests_equal": all(r[3] == alone[3] for r in plain)}
        if control and not record["mps_unavailable"]:
            try:
                with mps_server(control) as env:
                    served = at_once(shape, k, steps, env=env, timeout_s=90)
                row["mps_pairs_per_s"] = aggregate_rate(served, steps, shape.batch_size)
                row["digests_equal"] &= all(r[3] == alone[3] for r in served)
            except RuntimeError as err:  # MPS refused here (a container, a driver): the plain curve goes on
                record["mps_unavailable"] = f"{type(err).__name__}: {err}"
        rows[str(k)] = row
        ratio = row["mps_pairs_per_s"] / row["plain_pairs_per_s"] if row["mps_pairs_per_s"] else None
        print(f"{model:<14} {k:>3} at once  plain {row['plain_pairs_per_s']:>9,.0f} pairs/s  "
              + (f"MPS {row['mps_pairs_per_s']:>9,.0f} pairs/s  MPS/plain x{ratio:.2f}" if ratio else
                 f"MPS not measured ({record['mps_unavailable']})")
              + f"  weights equal to the lone process's: {row['digests_equal']}", flush=True)
        if out:
            atomic_write_json(out, record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "gpt2-xl"])
    parser.add_argument("--counts", nargs="+", type=int, default=[8, 12, 4],
                        help="processes at once, in the order measured (the likeliest gain first)")
    parser.add_argument("--steps", type=int, default=100, help="AdamW steps each process times")
    parser.add_argument("--out", type=Path, help="the measurements as JSON, rewritten after each count")
    parser.add_argument("--cpu", action="store_true", help="the small twins on a CPU, 2 at once: this script's check")
    args = parser.parse_args(argv)
    # gpu-check stops a step at its deadline with SIGTERM: exit through the finally blocks, which quit the MPS daemon
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cpu:
        profile, device = config.load_profile("paper-twin"), torch.device("cpu")
        names, counts, steps = [m + "-twin-small" for m in args.models], [2], 3
    elif torch.cuda.is_available():
        profile, device = config.load_profile("paper"), torch.device("cuda")
        names, counts, steps = args.models, [k for k in args.counts if k <= concurrency.machine_cores()], args.steps
    else:
        parser.error("no CUDA GPU here: pass --cpu to check the script on the small twins")
    control = mps_control() if device.type == "cuda" else None
    record = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "steps": steps,
              "mps_control": control,
              "mps_unavailable": None if control else ("a CPU" if device.type != "cuda"
                                                       else "no nvidia-cuda-mps-control on this machine"),
              "models": {}}
    for model in names:
        measure(model, profile, device, counts, steps, control, record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
