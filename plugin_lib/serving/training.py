"""A Plugin trained on a user's own (prompt, completion) pairs, by the paper's protocol.

The file is JSONL (one object per line) or CSV, with the columns ``prompt`` and ``completion``.
Pairs are grouped by unique prompt and divided 60/40 into a training part and a
hyper-validation part (``data.split_hyper_validation``, as for the paper's datasets). Every
configuration of the recipe's grid (learning rate x weight decay; ``recipe.TrainingRecipe``, a
profile's or one's own) is trained with its budget (AdamW, warmup, early stopping on
hyper-validation loss), a choice at an edge pushes the grid further as the runner does
(``harness.run_keys.beyond_edge``), and the configuration with the lowest hyper-validation loss
is kept. The base's outputs are computed once for all of them (and
kept for a later run on the same pairs), and the configurations train together, each batch read
once for all (``core.train.fit_grid``); an interrupted run resumes each configuration where it
stopped; then the choice is trained again on every pair (``refit``, the default), so the saved
model has seen all the data.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from ..core.blackbox import BlackBoxLM
from ..core.reweighter import make_reweighter
from ..core.cache import BaseOutputCache
from ..core.pairs import encode_pairs
from ..core.train import (GridRun, TokenObjective, TrainConfig, configs_that_fit, fit, fit_grid, grid_pays,
                          reachable_plugin_log_probs)
from ..data.datasets import Example, split_hyper_validation, training_pairs
from ..data.prompts import format_for_model
from ..harness import run_keys
from . import estimate
from .artifact import BaseSpec, DecodingSettings, PluginModel, package_version
from .inputs import Pair, data_sha256
from .recipe import TrainingRecipe

def as_examples(pairs: list[Pair]) -> list[Example]:
    """One ``Example`` per unique prompt, its completions as references (first-seen order)."""
    grouped: dict[str, list[str]] = {}
    for pair in pairs:
        grouped.setdefault(pair.prompt, []).append(pair.completion)
    return [Example(f"user-{i}", prompt, tuple(completions), {"dataset": "user"})
            for i, (prompt, completions) in enumerate(grouped.items())]


def reweighter_arch(spec: BaseSpec, layers: int | None = None, width: int | None = None) -> dict:
    """The family's reweighting model (the authors'), with ``layers`` blocks and hidden width
    ``width`` where given (a LLaMA-style model keeps its 4x feed-forward ratio)."""
    arch = spec.reweighter_arch()
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--reweighter-layers must be at least 1, got {layers}.")
        arch["n_layer"] = layers
    if width is not None:
        key = {"llama": "hidden_size", "gpt2": "n_embd"}.get(arch["arch"])
        if key is None or width < 8:
            raise ValueError(f"--reweighter-width {width} does not apply to a {arch['arch']} reweighting model "
                             "(llama or gpt2, at least 8).")
        heads = arch.get("num_attention_heads", arch.get("n_head", 1))
        if width % heads:
            raise ValueError(f"--reweighter-width must be a multiple of its {heads} attention heads, got {width}.")
        arch[key] = width
        if arch["arch"] == "llama":
            arch["intermediate_size"] = 4 * width
    return arch


def _encoded(base: BlackBoxLM, examples, recipe: TrainingRecipe, prompt_format: str):
    return encode_pairs(base.tokenizer, [format_for_model(ex.source, base.tokenizer, prompt_format == "chat")
                                         for ex, _ in training_pairs(examples)],
                        [reference for _, reference in training_pairs(examples)],
                        max_prompt_tokens=recipe.max_prompt_tokens, max_target_tokens=recipe.max_target_tokens)


def _objective(base: BlackBoxLM, encoded, cache: BaseOutputCache) -> TokenObjective:
    return TokenObjective(encoded, base.tokenizer.pad_token_id, log_probs=reachable_plugin_log_probs, cache=cache)


def _rows(cache: BaseOutputCache, first: int, end: int) -> BaseOutputCache:
    """The cache of pairs ``first:end`` of ``cache``: a view of its rows, nothing copied."""
    lo, hi = int(cache.offsets[first]), int(cache.offsets[end])
    return BaseOutputCache(cache.rows[lo:hi], cache.offsets[first:end + 1] - lo, cache.placement, cache.head)


def _estimate(base: BlackBoxLM, arch: dict, encoded, split: int, recipe: TrainingRecipe, values: dict, seed: int,
              cache_dir: Path | None, resume_dir, refit: bool) -> estimate.Plan:
    """``estimate.plan`` of this call: the rates timed here, the grid's configurations less what a
    resumed run finished, the edge extensions at most."""
    grid = recipe.configs(values)
    done = [estimate.epochs_done(_resume_file(resume_dir, arch, h, recipe.config(h, seed)), recipe.max_epochs)
            for h in grid]
    grown = {k: v + [None] * (recipe.extend_edges if len(v) > 1 else 0) for k, v in values.items()}  # beyond_edge
    edges = len(recipe.configs(grown)) - len(grid) if recipe.extend_edges else 0
    rates = estimate.measure_rates(base, arch, encoded[:split], recipe.batch_size, seed)
    stored = cache_dir is not None and BaseOutputCache.is_stored(cache_dir, base, encoded)
    return estimate.plan(rates, encoded[:split], encoded[split:], recipe, configs=len(grid), edge_configs=edges,
                         epochs_done=done, base_stored=stored, refit=refit, seed=seed)


def train_plugin(base: BlackBoxLM, base_spec: BaseSpec, pairs: list[Pair], recipe: TrainingRecipe, *,
                 prompt_format: str = "plain", seed: int | None = None, arch: dict | None = None,
                 progress: bool = True, cache_dir: str | Path | None = None, resume_dir: str | Path | None = None,
                 refit: bool = True, announce=None) -> PluginModel:
    """A ``PluginModel`` trained on ``pairs`` by the recipe's grid and budget (a profile's:
    ``TrainingRecipe.from_profile``). ``seed``: default the recipe's.

    ``cache_dir``: where the base's outputs are kept and found again by a later run on the same
    pairs. ``resume_dir``: every configuration's training state, so an interrupted call resumes
    where it stopped (the caller removes it when done). ``refit`` (default): after the choice, train
    the chosen configuration again on all pairs for the chosen number of epochs, so the saved
    model has seen every pair (scikit-learn's ``refit=True``). ``announce``: gets
    the whole cost's estimate (``estimate.py``) before any work."""
    seed = recipe.seed if seed is None else seed
    arch = arch or reweighter_arch(base_spec)
    decoding = DecodingSettings(max_new_tokens=recipe.max_new_tokens, repetition_penalty=recipe.repetition_penalty,
                                prompt_format=prompt_format, max_prompt_tokens=recipe.max_prompt_tokens)
    train, hyper = split_hyper_validation(as_examples(pairs), seed=seed)
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    encoded = _encoded(base, train + hyper, recipe, prompt_format)  # train's pairs first, then hyper's
    split = len(training_pairs(train))
    values = recipe.grid()
    planned = None
    if announce is not None:  # before any work: the whole cost, timed here
        planned = _estimate(base, arch, encoded, split, recipe, values, seed, cache_dir, resume_dir, refit)
        announce(planned.describe())
    # The base's outputs once for every pair: the grid reads its two parts, the refit all of it.
    phases, started = {}, time.perf_counter()
    cache = BaseOutputCache.build(base, encoded, directory=cache_dir, progress=progress)
    phases["base_outputs_s"] = round(time.perf_counter() - started, 1)
    everything = _objective(base, encoded, cache)
    objectives = {"train": _objective(base, encoded[:split], _rows(cache, 0, split)),
                  "hyper": _objective(base, encoded[split:], _rows(cache, split, len(encoded)))}

    grid_started = time.perf_counter()
    results, best = _search(base, arch, objectives, recipe, values, seed, resume_dir, progress)
    model, chosen = best
    record = {
        "pairs": len(pairs), "prompts": len(train) + len(hyper),
        "train_pairs": len(objectives["train"]), "hyper_pairs": len(objectives["hyper"]),
        "data_sha256": data_sha256(pairs), "profile": recipe.name, "seed": seed, "arch": arch,
        "max_epochs": recipe.max_epochs,
        "grid": values, "configs": list(results.values()), "hparams": chosen["hparams"],
        "val_loss": chosen["val_loss"], "best_epoch": chosen["best_epoch"],
    }
    phases["grid_s"] = round(time.perf_counter() - grid_started, 1)
    if refit:
        refit_started = time.perf_counter()
        model, record["refit"] = _refit(base, arch, recipe, chosen, everything, seed, progress)
        phases["refit_s"] = round(time.perf_counter() - refit_started, 1)
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["phases"] = phases
    if planned is not None:
        record["estimate"] = planned.as_record()
    record["package_version"] = package_version()
    return PluginModel(base, model.eval(), base_spec=base_spec, decoding=decoding, training=record)


def _search(base: BlackBoxLM, arch: dict, objectives: dict, recipe: TrainingRecipe, values: dict, seed: int,
            resume_dir: str | Path | None, progress: bool) -> tuple[dict, tuple]:
    """The recipe's grid over ``values`` (grown past an edge the choice sits on, as the runner
    does): every configuration's result, and the best (its model, its result)."""
    results: dict[tuple, dict] = {}
    best = None
    extensions = {k: 0 for k in values}
    while True:
        todo = [h for h in recipe.configs(values) if tuple(sorted(h.items())) not in results]
        while todo:  # the configurations together (fit_grid: one pass over the data), as many as memory holds
            first = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
            count = configs_that_fit(first, len(todo)) if grid_pays(base.device, objectives["train"].cache) else 1
            chunk, todo = todo[:count], todo[count:]
            runs = []
            for hparams in chunk:
                cfg = recipe.config(hparams, seed)
                model = first if not runs else make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(
                    base.device)
                runs.append(GridRun(model, objectives["train"], objectives["hyper"], cfg,
                                    _resume_file(resume_dir, arch, hparams, cfg), keep_checkpoint=resume_dir is not None))
            for run, hparams, result in zip(runs, chunk, fit_grid(runs, progress=progress)):
                results[tuple(sorted(hparams.items()))] = {"hparams": hparams, "val_loss": result.best_val_loss,
                                                          "best_epoch": result.best_epoch, "epochs_run": result.epochs_run}
                if best is None or result.best_val_loss < best[1]["val_loss"]:
                    best = (run.model, results[tuple(sorted(hparams.items()))])
            del runs, first
        pushed = [k for k in run_keys.grid_edges(values, best[1]["hparams"]) if extensions[k] < recipe.extend_edges]
        if not pushed:
            return results, best
        for k in pushed:
            values[k].append(run_keys.beyond_edge(values[k], best[1]["hparams"][k], k))
            extensions[k] += 1


def _resume_file(resume_dir, arch: dict, hparams: dict, cfg: TrainConfig) -> Path | None:
    """A configuration's training state in ``resume_dir``, named after everything it depends on
    besides the data (the caller's folder is the data's)."""
    if resume_dir is None:
        return None
    key = hashlib.sha256(json.dumps([arch, hparams, repr(cfg)], sort_keys=True).encode()).hexdigest()[:16]
    return Path(resume_dir) / f"config-{key}.pt"


def _refit(base: BlackBoxLM, arch: dict, recipe: TrainingRecipe, chosen: dict, everything: TokenObjective, seed: int,
           progress: bool):
    """The chosen configuration trained again on every pair for its chosen number of epochs
    (no pair is held out, so nothing stops it early)."""
    epochs = max(1, chosen["best_epoch"])
    model = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
    cfg = recipe.config(chosen["hparams"], seed, max_epochs=epochs, patience=epochs + 1)
    result = fit(model, everything, everything, cfg, progress=progress)
    return model, {"pairs": len(everything), "epochs": epochs, "train_loss": result.history[-1]["train_loss"]}

