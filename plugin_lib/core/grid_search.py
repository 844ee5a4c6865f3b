"""The Plugin trained on encoded pairs by a grid search, in memory: the base's outputs computed
once, every configuration of the grid trained on the training part and scored on the
hyper-validation part, an edge the choice sits on pushed further, then (``refit``) the choice
trained again on every pair.

The rule for a choice at an edge (:func:`beyond_edge`) is the experiments' too
(``harness.running.search`` applies it to stored searches). The user's ``train``
(``serving.training``) calls :func:`train_on_pairs`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path

from . import train_estimate
from .blackbox import BlackBoxLM
from .cache import BaseOutputCache
from .pairs import EncodedPair
from .reweighter import make_reweighter
from .train import (GridRun, TokenObjective, TrainConfig, configs_that_fit, fit, fit_grid, grid_pays,
                    reachable_plugin_log_probs)


def beyond_edge(values: Sequence[float], chosen: float, key: str) -> float | None:
    """The next value past the grid's edge where ``chosen`` sits, or None (not at an edge, or
    a single value). Rates and decays step geometrically by the edge's own ratio; alpha, a
    mixture weight in (0, 1), steps by the edge's spacing, or halves the gap to 0 or 1."""
    ordered = sorted(values)
    if len(ordered) < 2 or chosen not in (ordered[0], ordered[-1]):
        return None
    low = chosen == ordered[0]
    edge, inner = (ordered[0], ordered[1]) if low else (ordered[-1], ordered[-2])
    if key != "alpha":
        return edge * edge / inner
    step = edge - (inner - edge)
    bound = 0.0 if low else 1.0
    return step if (step > 0 if low else step < 1) else (edge + bound) / 2


def grid_edges(values: dict[str, list[float]], hparams: dict) -> list[str]:
    """The hyperparameters whose chosen value sits at the edge of a grid of two or more values."""
    return [k for k, v in values.items() if k in hparams and beyond_edge(v, hparams[k], k) is not None]


def configurations(values: dict[str, list]) -> list[dict]:
    """Every combination of ``values`` (one list per hyperparameter), the first key outermost."""
    return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]


def edge_configurations(values: dict[str, list], extend_edges: int) -> int:
    """How many configurations pushing edges may add at most (each list of two or more values
    growing by ``extend_edges``)."""
    if not extend_edges:
        return 0
    grown = {k: v + [None] * (extend_edges if len(v) > 1 else 0) for k, v in values.items()}
    return len(configurations(grown)) - len(configurations(values))


def resume_file(resume_dir: str | Path | None, arch: dict, config: TrainConfig) -> Path | None:
    """A configuration's training state in ``resume_dir``, named after everything it depends on
    besides the data (the caller's folder is the data's)."""
    if resume_dir is None:
        return None
    # lr and weight decay are in repr(config) too; kept in the key so that the state files of a
    # call interrupted before this module existed keep their names and resume
    hparams = {"lr": config.lr, "weight_decay": config.weight_decay}
    key = hashlib.sha256(json.dumps([arch, hparams, repr(config)], sort_keys=True).encode()).hexdigest()[:16]
    return Path(resume_dir) / f"config-{key}.pt"


def with_hparams(config: TrainConfig, hparams: dict, **changes) -> TrainConfig:
    """``config`` (the budget and seed) at one configuration's learning rate and weight decay."""
    return dataclasses.replace(config, lr=hparams["lr"], weight_decay=hparams["weight_decay"], **changes)


def estimate(base: BlackBoxLM, arch: dict, encoded: Sequence[EncodedPair], split: int, values: dict[str, list],
             config: TrainConfig, *, extend_edges: int = 0, cache_dir: Path | None = None,
             resume_dir: str | Path | None = None, refit: bool = True) -> train_estimate.Plan:
    """What :func:`train_on_pairs` will cost at these arguments (``train_estimate.plan``): the
    rates timed here, the grid's configurations less what a resumed run finished, the edge
    extensions at most."""
    grid = configurations(values)
    done = [train_estimate.epochs_done(resume_file(resume_dir, arch, with_hparams(config, h)), config.max_epochs)
            for h in grid]
    rates = train_estimate.measure_rates(base, arch, encoded[:split], config.batch_size, config.seed)
    stored = cache_dir is not None and BaseOutputCache.is_stored(cache_dir, base, encoded)
    return train_estimate.plan(rates, encoded[:split], encoded[split:], config, configs=len(grid),
                               edge_configs=edge_configurations(values, extend_edges), epochs_done=done,
                               base_stored=stored, refit=refit, seed=config.seed)


def _objective(base: BlackBoxLM, encoded: Sequence[EncodedPair], cache: BaseOutputCache) -> TokenObjective:
    return TokenObjective(encoded, base.tokenizer.pad_token_id, log_probs=reachable_plugin_log_probs, cache=cache)


def _rows(cache: BaseOutputCache, first: int, end: int) -> BaseOutputCache:
    """The cache of pairs ``first:end`` of ``cache``: a view of its rows, nothing copied."""
    lo, hi = int(cache.offsets[first]), int(cache.offsets[end])
    return BaseOutputCache(cache.rows[lo:hi], cache.offsets[first:end + 1] - lo, cache.placement, cache.head)


def train_on_pairs(base: BlackBoxLM, arch: dict, encoded: Sequence[EncodedPair], split: int,
                   values: dict[str, list[float]], config: TrainConfig, *, extend_edges: int = 0,
                   cache_dir: Path | None = None, resume_dir: str | Path | None = None, refit: bool = True,
                   progress: bool = True):
    """The reweighting model chosen on ``encoded[split:]`` (hyper-validation) among the grid's
    configurations trained on ``encoded[:split]``, and what its training record says: the
    configurations' results, the choice, the refit and each phase's seconds. ``values`` is
    grown in place by the edges pushed."""
    phases, started = {}, time.perf_counter()
    # The base's outputs once for every pair: the grid reads its two parts, the refit all of it.
    cache = BaseOutputCache.build(base, encoded, directory=cache_dir, progress=progress)
    phases["base_outputs_s"] = round(time.perf_counter() - started, 1)
    train = _objective(base, encoded[:split], _rows(cache, 0, split))
    hyper = _objective(base, encoded[split:], _rows(cache, split, len(encoded)))
    grid_started = time.perf_counter()
    results, (model, chosen) = search(base, arch, train, hyper, values, config, extend_edges=extend_edges,
                                      resume_dir=resume_dir, progress=progress)
    phases["grid_s"] = round(time.perf_counter() - grid_started, 1)
    record = {"train_pairs": len(train), "hyper_pairs": len(hyper), "configs": list(results.values()),
              "hparams": chosen["hparams"], "val_loss": chosen["val_loss"], "best_epoch": chosen["best_epoch"]}
    if refit:
        refit_started = time.perf_counter()
        epochs = max(1, chosen["best_epoch"])
        everything = _objective(base, encoded, cache)
        model = make_reweighter(vocab_size=base.vocab_size, seed=config.seed, **arch).to(base.device)
        # no pair is held out, so nothing stops it early
        result = fit(model, everything, everything, with_hparams(config, chosen["hparams"], max_epochs=epochs,
                                                                 patience=epochs + 1), progress=progress)
        record["refit"] = {"pairs": len(everything), "epochs": epochs,
                           "train_loss": result.history[-1]["train_loss"]}
        phases["refit_s"] = round(time.perf_counter() - refit_started, 1)
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["phases"] = phases
    return model.eval(), record


def search(base: BlackBoxLM, arch: dict, train: TokenObjective, hyper: TokenObjective, values: dict,
           config: TrainConfig, *, extend_edges: int, resume_dir: str | Path | None, progress: bool
           ) -> tuple[dict, tuple]:
    """The grid over ``values`` (grown past an edge the choice sits on, at most ``extend_edges``
    times a hyperparameter): every configuration's result, and the best (its model, its result).
    The configurations train together (``fit_grid``: one pass over the data), as many as memory holds."""
    results: dict[tuple, dict] = {}
    best = None
    extensions = {k: 0 for k in values}
    while True:
        todo = [h for h in configurations(values) if tuple(sorted(h.items())) not in results]
        while todo:
            first = make_reweighter(vocab_size=base.vocab_size, seed=config.seed, **arch).to(base.device)
            count = configs_that_fit(first, len(todo)) if grid_pays(base.device, train.cache) else 1
            chunk, todo = todo[:count], todo[count:]
            runs = []
            for hparams in chunk:
                cfg = with_hparams(config, hparams)
                model = first if not runs else make_reweighter(vocab_size=base.vocab_size, seed=config.seed,
                                                               **arch).to(base.device)
                runs.append(GridRun(model, train, hyper, cfg, resume_file(resume_dir, arch, cfg),
                                    keep_checkpoint=resume_dir is not None))
            for run, hparams, result in zip(runs, chunk, fit_grid(runs, progress=progress)):
                results[tuple(sorted(hparams.items()))] = {"hparams": hparams, "val_loss": result.best_val_loss,
                                                          "best_epoch": result.best_epoch, "epochs_run": result.epochs_run}
                if best is None or result.best_val_loss < best[1]["val_loss"]:
                    best = (run.model, results[tuple(sorted(hparams.items()))])
            del runs, first
        pushed = [k for k in grid_edges(values, best[1]["hparams"]) if extensions[k] < extend_edges]
        if not pushed:
            return results, best
        for k in pushed:
            values[k].append(beyond_edge(values[k], best[1]["hparams"][k], k))
            extensions[k] += 1
