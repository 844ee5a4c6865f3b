"""What training on pairs will cost (``core.grid_search.train_on_pairs``, the user's ``train``),
said before any work: the base's outputs, the grid, the refit.

Each phase's rate is timed here on a few batches drawn as training draws them (after one batch of
warm-up), as seconds per padded token, and multiplied by the padded tokens the phase reads: the
base's outputs in file order, training in shuffled batches (simulated with the same batch size),
hyper-validation in the order it is scored. Timing one batch and counting batches was 2-3x low on
files whose prompts vary in length (issue 61); per padded token follows them. A resumed run
counts only what its checkpoints leave to do. benchmarks/bench_train_estimate.py holds the
estimate against the time taken.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .blackbox import BlackBoxLM
from .pairs import EncodedPair
from .reweighter import make_reweighter
from .cache import BaseOutputCache
from .train import TokenObjective, TrainConfig, reachable_plugin_log_probs

BASE_BATCH = 8  # BaseOutputCache.build's batch
HYPER_BATCH = 16  # core.train.mean_nlls's batch
TIMED_BATCHES = 2


@dataclass
class Rates:
    """Seconds per padded token: the base's forward, a training step, a scoring pass."""

    base: float
    step: float
    score: float


@dataclass
class Plan:
    """The phases' seconds: base outputs, the grid, the edge extensions at most, the refit. At
    most, every configuration runs every epoch left and the refit all ``max_epochs``; at least,
    each stops as early as its patience allows and the refit runs one epoch."""

    base_s: float
    grid_s: float
    grid_configs: int
    epochs_left: int
    least_epochs_left: int
    epoch_s: float
    edges_s: float
    edge_configs: int
    refit_epoch_s: float
    refit_epochs: int

    @property
    def refit_s(self) -> float:
        return self.refit_epoch_s * self.refit_epochs

    @property
    def total_s(self) -> float:
        return self.base_s + self.grid_s + self.refit_s

    @property
    def least_s(self) -> float:
        return self.base_s + self.least_epochs_left * self.epoch_s + self.refit_epoch_s * min(1, self.refit_epochs)

    def as_record(self) -> dict:
        """The estimate as the training record keeps it, beside the seconds each phase took."""
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()} | {
            "total_s": round(self.total_s, 1), "least_s": round(self.least_s, 1)}

    def describe(self) -> str:
        base = "found stored" if self.base_s == 0 else _duration(self.base_s)
        grid = (f"{self.grid_configs} configuration(s), {_span(self.least_epochs_left, self.epochs_left)} epoch(s) "
                f"left in all, {_duration(self.epoch_s)} an epoch") if self.grid_configs else "done"
        refit = (f"; refit on every pair, {_span(1, self.refit_epochs)} epoch(s) of {_duration(self.refit_epoch_s)}"
                 if self.refit_epochs else "")
        total = _span(_duration(self.least_s), _duration(self.total_s), " to ")
        lines = [f"estimated {total}, timed here (the longer if no configuration stops early): base outputs {base}; "
                 f"grid {grid}{refit}"]
        if self.edge_configs:
            lines.append(f"  a choice at the grid's edge adds up to {self.edge_configs} configuration(s), "
                         f"{_duration(self.edges_s)}")
        return "\n".join(lines)


def _span(least, most, between: str = "-") -> str:
    return f"{least}" if least == most else f"{least}{between}{most}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 1):,.0f} s"
    return f"{seconds / 60:,.1f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def padded_tokens(pairs: list[EncodedPair], order: list[int], batch_size: int) -> int:
    """Tokens of the left-padded batches of ``pairs`` read in ``order`` (``collate``'s width)."""
    lengths = np.array([len(pairs[i].input_ids) for i in order])
    return int(sum(len(chunk) * chunk.max() for chunk in np.array_split(lengths, range(batch_size, len(lengths),
                                                                                         batch_size)) if len(chunk)))


def shuffled_tokens(pairs: list[EncodedPair], batch_size: int, seed: int) -> int:
    """Padded tokens of one training epoch (batches of a random permutation)."""
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    return padded_tokens(pairs, order, batch_size)


def measure_rates(base: BlackBoxLM, arch: dict, pairs: list[EncodedPair], batch_size: int, seed: int) -> Rates:
    """Per padded token: the base's outputs, a training step and a scoring pass, each on
    ``TIMED_BATCHES`` random batches of ``pairs`` after a batch of warm-up."""
    generator = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(len(pairs), generator=generator).tolist()
    batches = [order[i * batch_size:(i + 1) * batch_size] for i in range(TIMED_BATCHES + 1)]
    batches = [b for b in batches if b] or [order]
    model = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    spent = {"base": 0.0, "step": 0.0, "score": 0.0}
    tokens = {"base": 0, "step": 0, "score": 0}
    for n, batch in enumerate(batches):
        chosen = [pairs[i] for i in batch]
        started = time.perf_counter()
        cache = BaseOutputCache.build(base, chosen, batch_size=BASE_BATCH, progress=False, placement="memory",
                                      layout="full")
        _sync(base.device)
        base_s = time.perf_counter() - started
        objective = TokenObjective(chosen, base.tokenizer.pad_token_id, log_probs=reachable_plugin_log_probs,
                                   cache=cache)
        started = time.perf_counter()
        loss, count = objective.nll(model, list(range(len(chosen))))
        (loss / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(base.device)
        step_s = time.perf_counter() - started
        started = time.perf_counter()
        with torch.no_grad():
            objective.nll(model, list(range(len(chosen))))
        _sync(base.device)
        score_s = time.perf_counter() - started
        if n == 0 and len(batches) > 1:
            continue  # warm-up: first calls allocate and compile
        whole = padded_tokens(chosen, list(range(len(chosen))), len(chosen))  # stepped and scored as one batch
        for phase, seconds, count in (("base", base_s, padded_tokens(chosen, list(range(len(chosen))), BASE_BATCH)),
                                      ("step", step_s, whole), ("score", score_s, whole)):
            spent[phase] += seconds
            tokens[phase] += count
    return Rates(**{phase: spent[phase] / tokens[phase] for phase in spent})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plan(rates: Rates, train: list[EncodedPair], hyper: list[EncodedPair], config: TrainConfig, *, configs: int,
         edge_configs: int, epochs_done: list[int], base_stored: bool, refit: bool, seed: int) -> Plan:
    """The phases' seconds (``Plan``); ``epochs_done``: one entry per configuration, the epochs
    its checkpoint holds (a finished one counts ``max_epochs``)."""
    batch, max_epochs = config.batch_size, config.max_epochs
    everything = list(train) + list(hyper)
    step_tokens = shuffled_tokens(train, batch, seed)
    score_tokens = padded_tokens(hyper, list(range(len(hyper))), HYPER_BATCH)
    epoch = rates.step * step_tokens + rates.score * score_tokens
    left = sum(max(0, max_epochs - done) for done in epochs_done)
    earliest = min(max_epochs, config.patience + 1)  # best at epoch 1, then patience epochs worse
    least = sum(max(0, earliest - done) for done in epochs_done)
    base_s = 0.0 if base_stored else rates.base * padded_tokens(everything, list(range(len(everything))), BASE_BATCH)
    refit_epoch = (rates.step * shuffled_tokens(everything, batch, seed)
                   + rates.score * padded_tokens(everything, list(range(len(everything))), HYPER_BATCH))
    return Plan(base_s=base_s, grid_s=left * epoch, grid_configs=sum(d < max_epochs for d in epochs_done),
                epochs_left=left, least_epochs_left=least, epoch_s=epoch, edges_s=edge_configs * max_epochs * epoch,
                edge_configs=edge_configs, refit_epoch_s=refit_epoch, refit_epochs=max_epochs if refit else 0)


def epochs_done(checkpoint: Path | None, max_epochs: int) -> int:
    """Epochs a configuration's resume checkpoint holds (``max_epochs`` once it finished)."""
    if checkpoint is None or not Path(checkpoint).exists():
        return 0
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a damaged checkpoint is trained over (core.train warns)
        return 0
    return max_epochs if state.get("finished") else min(max_epochs, len(state.get("history", [])))
