"""GPU classes a user may name to the preflight (``--gpu``), and rates estimated for them.

A rate measured on the GPU itself (the preflight run there measures the full-size shape twins
for a few seconds; ``benchmarks/bench_gpu.py``) is always preferred. Without one, the rates of
an earlier H100 probe of the paper's shapes (docs/gpu.md) are scaled to the named card by its
published dense half-precision tensor throughput (training, cache building, fine-tuning) or its
memory bandwidth (decoding, which reads every weight once a step), and every hour figure made
from them is labelled an estimate.
"""
from __future__ import annotations

import glob
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..machine import results_path
from ..profile import REPO_ROOT, Profile

GIB = 2**30


@dataclass(frozen=True)
class GpuClass:
    name: str
    memory_gib: float  # what torch reports as the card's total memory
    bf16: bool  # bfloat16 support (a T4 has none: LLaMA then loads in float16)
    tflops: float  # published dense float16/bfloat16 tensor throughput
    bandwidth_gbs: float  # published memory bandwidth, GB/s


GPUS = {
    "t4": GpuClass("NVIDIA T4 (16 GB)", 14.7, False, 65.0, 320.0),
    "l4": GpuClass("NVIDIA L4 (24 GB)", 22.0, True, 121.0, 300.0),
    "a100-40": GpuClass("NVIDIA A100 40 GB", 39.4, True, 312.0, 1555.0),
    "a100-80": GpuClass("NVIDIA A100 80 GB", 79.2, True, 312.0, 2039.0),
    "h100": GpuClass("NVIDIA H100 80 GB (SXM)", 79.1, True, 989.0, 3350.0),
    "h200": GpuClass("NVIDIA H200 (141 GB)", 139.8, True, 989.0, 4800.0),
}

# The H100 probe (docs/gpu.md; shape twins, batch 8): base-output cache building and Plugin
# training from a cache held on the GPU, in pairs per second. GPT2-M was not probed: GPT2-XL's
# rates stand for it (an upper bound on its time).
PROBED_H100 = {"gpt2-xl": {"cache": 198.0, "train": 1167.0}, "llama-3.1-8b": {"cache": 43.0, "train": 570.0}}
PROBE_CARD = "h100"
PAPER_NAMES = {"GPT2-M": "gpt2-xl", "GPT2-XL": "gpt2-xl", "LLaMA-3.1-8B": "llama-3.1-8b"}
# Plugin / base decoding time measured on the H100 probe (LLaMA-8B bf16 1.17 at batch 8, 1.07 at
# 32; GPT2-XL fp16 1.23 and 0.94): the larger is used.
PLUGIN_DECODE_RATIO = 1.23
# Per transformer block and decoding step, the kernel launches of an eager transformers model
# (about 10 kernels of about 6 microseconds): what a small model's step costs beyond its weights.
LAUNCH_S_PER_LAYER = 6e-5
# The share of its published throughput a card reaches on the output layer's matrix products.
ACHIEVED_SHARE = 0.4


def gpu_class(name: str) -> GpuClass:
    if name not in GPUS:
        raise ValueError(f"Unknown GPU {name!r}; choose one of {', '.join(GPUS)}.")
    return GPUS[name]


def probe_rates(paper_model: str) -> dict | None:
    """The probed H100 rates of the paper base ``paper_model`` ("GPT2-M", ...), or None."""
    return PROBED_H100.get(PAPER_NAMES.get(paper_model, ""))


def compute_ratio(card: GpuClass) -> float:
    """How much slower than the probe's H100 ``card`` computes (>= 1 for a slower card)."""
    return GPUS[PROBE_CARD].tflops / card.tflops


def decode_step_s(card: GpuClass, weight_bytes: int, layers: int) -> float:
    """One greedy step of a base: its weights read once from memory, plus kernel launches."""
    return weight_bytes / (card.bandwidth_gbs * 1e9) + layers * LAUNCH_S_PER_LAYER


def head_s_per_token(card: GpuClass, hidden: int, vocab: int) -> float:
    """The compact cache's output layer on one target token (a d x V product, 2dV FLOPs)."""
    return 2 * hidden * vocab / (ACHIEVED_SHARE * card.tflops * 1e12)


def _epochs_run(folder: Path) -> list[int]:
    runs = []
    for path in glob.glob(str(folder / "runs" / "**" / "*-selection.json"), recursive=True):
        try:
            configs = json.loads(Path(path).read_text(encoding="utf-8")).get("configs", {})
        except (OSError, ValueError):
            continue
        runs += [c["epochs_run"] for c in configs.values() if "epochs_run" in c]
    return runs


def expected_epochs(profile: Profile) -> tuple[float, str]:
    """(epochs a training is expected to run under ``profile``'s cap and patience, the basis).

    The mean epochs run by the profile's own stored trainings (every configuration of every
    selection, early-stopped on hyper-validation loss) where there are some; otherwise by the
    committed ``confirm`` trainings (cap 40, patience 4) plus the difference in patience, at most
    the cap: CPU-scale trainings (SmolLM2 on subsets), so an estimate, labelled so."""
    cap, patience = profile.training.max_epochs, profile.training.patience
    own = _epochs_run(results_path(profile))
    if own:
        return min(float(cap), statistics.fmean(own)), f"the mean of this profile's {len(own)} stored trainings"
    runs = _epochs_run(REPO_ROOT / "results" / "confirm")
    if not runs:
        return float(cap), "no stored trainings to estimate from: the cap"
    mean, extra = statistics.fmean(runs), max(0, patience - 4)
    return min(float(cap), mean + extra), (
        f"an estimate: the mean epochs run by the {len(runs)} committed results/confirm trainings ({mean:.1f}; "
        f"cap 40, patience 4, SmolLM2 on subsets), plus {extra} for patience {patience}")
