"""A Plugin trained on a user's own (prompt, completion) pairs, by the paper's protocol.

The file is JSONL (one object per line) or CSV, with the columns ``prompt`` and ``completion``.
Pairs are grouped by unique prompt and divided 60/40 into a training part and a
hyper-validation part (``data.split_hyper_validation``, as for the paper's datasets). Every
configuration of the profile's grid (learning rate x weight decay) is trained with the profile's
budget (AdamW, warmup, early stopping on hyper-validation loss), a choice at an edge pushes the
grid further as the runner does (``harness.runner.beyond_edge``), and the configuration with the
lowest hyper-validation loss is kept. The base's outputs are computed once for all of them (and
kept for a later run on the same pairs), and the configurations train together, each batch read
once for all (``core.train.fit_grid``); an interrupted run resumes each configuration where it
stopped; then the choice is trained again on every pair (``refit``, the default), so the saved
model has seen all the data.
"""
from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.blackbox import BlackBoxLM
from ..core.reweighter import make_reweighter
from ..core.train import (BaseOutputCache, GridRun, TokenObjective, TrainConfig, configs_that_fit, encode_pairs, fit,
                          fit_grid, grid_pays, reachable_plugin_log_probs)
from ..data.datasets import Example, split_hyper_validation, training_pairs
from ..data.prompts import format_for_model
from ..harness import models, runner
from ..harness.profile import Profile
from .artifact import BaseSpec, DecodingSettings, PluginModel, package_version

COLUMNS = ("prompt", "completion")
MIN_PROMPTS = 2


class DataFileError(ValueError):
    """A training file that cannot be used as it is."""


@dataclass(frozen=True)
class Pair:
    prompt: str
    completion: str


def read_pairs(path: str | Path) -> list[Pair]:
    """The (prompt, completion) pairs of a JSONL or CSV file, with an error that names the line
    and what to do for a missing file, an empty one, a missing column or a non-text value."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file. Pass a JSONL or CSV file of {' and '.join(COLUMNS)} columns.")
    try:
        return _read_pairs(path)
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}). Save it as UTF-8.") from None


def _read_pairs(path: Path) -> list[Pair]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if reader.fieldnames and missing:
                raise DataFileError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {reader.fieldnames}). "
                                    f"The file needs the columns {COLUMNS}.")
            rows = [(i + 2, row) for i, row in enumerate(reader)]
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFileError(f"{path}:{number}: not a JSON object ({err.msg}). JSONL has one object per line.") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{number}: a {type(row).__name__}, not an object with {COLUMNS}.")
            rows.append((number, row))
    else:
        raise DataFileError(f"{path}: unknown file type {path.suffix!r}; use .jsonl or .csv.")
    if not rows:
        raise DataFileError(f"{path} is empty: it needs (prompt, completion) pairs, one per line.")
    pairs = []
    for number, row in rows:
        for column in COLUMNS:
            value = row.get(column)
            if not isinstance(value, str) or not value.strip():
                what = "missing" if value is None else f"not a non-empty string ({value!r:.40})"
                raise DataFileError(f"{path}:{number}: {column!r} is {what}. Every pair needs both {COLUMNS}.")
        pairs.append(Pair(row["prompt"], row["completion"]))
    if len({p.prompt for p in pairs}) < MIN_PROMPTS:
        raise DataFileError(f"{path}: {len(pairs)} pairs but fewer than {MIN_PROMPTS} distinct prompts: the "
                            "hyper-validation part needs prompts of its own.")
    return pairs


def data_sha256(pairs: list[Pair]) -> str:
    """A hash of the pairs themselves (not of the file's formatting)."""
    digest = hashlib.sha256()
    for pair in pairs:
        digest.update(json.dumps([pair.prompt, pair.completion]).encode())
    return digest.hexdigest()


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
    arch = models.reweighter_spec(_family(spec))
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


def _encoded(base: BlackBoxLM, examples, profile: Profile, prompt_format: str):
    return encode_pairs(base.tokenizer, [format_for_model(ex.source, base.tokenizer, prompt_format == "chat")
                                         for ex, _ in training_pairs(examples)],
                        [reference for _, reference in training_pairs(examples)],
                        max_prompt_tokens=profile.tokens.max_prompt, max_target_tokens=profile.tokens.max_target)


def _objective(base: BlackBoxLM, encoded, cache_dir: Path | None, progress: bool) -> TokenObjective:
    """The Plugin's training objective; the base's outputs are read from ``cache_dir`` when an
    earlier run stored them for the same base and pairs (``BaseOutputCache`` keys them)."""
    cache = BaseOutputCache.build(base, encoded, directory=cache_dir, progress=progress)
    return TokenObjective(encoded, base.tokenizer.pad_token_id, log_probs=reachable_plugin_log_probs, cache=cache)


def _estimate(base: BlackBoxLM, arch: dict, objective: TokenObjective, hyper: TokenObjective, profile: Profile,
              configs: int, seed: int) -> str:
    """The grid's time at most, from two training steps and one hyper-validation batch timed here."""
    model = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch = profile.training.batch_size
    first = list(range(min(batch, len(objective))))
    started = time.perf_counter()
    for _ in range(2):
        loss, n = objective.nll(model, first)
        (loss / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step = (time.perf_counter() - started) / 2
    started = time.perf_counter()
    with torch.no_grad():
        hyper.nll(model, list(range(min(batch, len(hyper)))))
    scored = time.perf_counter() - started
    epoch = step * -(-len(objective) // batch) + scored * -(-len(hyper) // batch)
    total = configs * profile.training.max_epochs * epoch
    shown = f"{total:,.0f} s" if total < 120 else f"{total / 60:,.1f} min"
    return (f"estimated at most {shown}: {configs} configuration(s) x up to "
            f"{profile.training.max_epochs} epochs x {epoch:,.1f} s an epoch (timed here); early stopping ends "
            "most sooner")


def train_plugin(base: BlackBoxLM, base_spec: BaseSpec, pairs: list[Pair], profile: Profile, *,
                 prompt_format: str = "plain", seed: int | None = None, arch: dict | None = None,
                 progress: bool = True, cache_dir: str | Path | None = None, resume_dir: str | Path | None = None,
                 refit: bool = True, announce=None) -> PluginModel:
    """A ``PluginModel`` trained on ``pairs`` by the profile's grid and budget.

    ``cache_dir``: where the base's outputs are kept and found again by a later run on the same
    pairs. ``resume_dir``: every configuration's training state, so an interrupted call resumes
    where it stopped (the caller removes it when done). ``refit`` (default): after the choice, train
    the chosen configuration again on all pairs for the chosen number of epochs, so the saved
    model has seen every pair (scikit-learn's ``refit=True``). ``announce``: gets
    the time estimate before the grid starts."""
    seed = profile.seeds[0] if seed is None else seed
    arch = arch or reweighter_arch(base_spec)
    decoding = DecodingSettings(max_new_tokens=profile.decoding.max_new_tokens,
                                repetition_penalty=profile.decoding.repetition_penalty,
                                prompt_format=prompt_format, max_prompt_tokens=profile.tokens.max_prompt)
    train, hyper = split_hyper_validation(as_examples(pairs), seed=seed)
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    objectives = {part: _objective(base, _encoded(base, examples, profile, prompt_format), cache_dir, progress)
                  for part, examples in (("train", train), ("hyper", hyper))}

    values = {k: list(getattr(profile.grid, k)) for k in runner.grid_keys("Plugin")}
    if announce is not None:
        most = len(runner.hparam_grid(profile, "Plugin", values)) + profile.grid.extend_edges * len(values)
        announce(_estimate(base, arch, objectives["train"], objectives["hyper"], profile, most, seed))
    results: dict[tuple, dict] = {}
    best = None
    extensions = {k: 0 for k in values}
    started = time.perf_counter()
    while True:
        todo = [h for h in runner.hparam_grid(profile, "Plugin", values) if tuple(sorted(h.items())) not in results]
        while todo:  # the configurations together (fit_grid: one pass over the data), as many as memory holds
            first = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
            count = configs_that_fit(first, len(todo)) if grid_pays(base.device, objectives["train"].cache) else 1
            chunk, todo = todo[:count], todo[count:]
            runs = []
            for hparams in chunk:
                cfg = _config(profile, hparams, seed)
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
        pushed = [k for k in runner.grid_edges(values, best[1]["hparams"]) if extensions[k] < profile.grid.extend_edges]
        if not pushed:
            break
        for k in pushed:
            values[k].append(runner.beyond_edge(values[k], best[1]["hparams"][k], k))
            extensions[k] += 1
    model, chosen = best
    record = {
        "pairs": len(pairs), "prompts": len(train) + len(hyper),
        "train_pairs": len(objectives["train"]), "hyper_pairs": len(objectives["hyper"]),
        "data_sha256": data_sha256(pairs), "profile": profile.name, "seed": seed, "arch": arch,
        "max_epochs": profile.training.max_epochs,
        "grid": values, "configs": list(results.values()), "hparams": chosen["hparams"],
        "val_loss": chosen["val_loss"], "best_epoch": chosen["best_epoch"],
    }
    if refit:
        model, record["refit"] = _refit(base, arch, profile, chosen, train + hyper, prompt_format, cache_dir, seed,
                                        progress)
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["package_version"] = package_version()
    return PluginModel(base, model.eval(), base_spec=base_spec, decoding=decoding, training=record)


def _config(profile: Profile, hparams: dict, seed: int, **changes) -> TrainConfig:
    settings = dict(lr=hparams["lr"], weight_decay=hparams["weight_decay"], seed=seed,
                    max_epochs=profile.training.max_epochs, patience=profile.training.patience,
                    batch_size=profile.training.batch_size, warmup_ratio=profile.training.warmup_ratio)
    return TrainConfig(**{**settings, **changes})


def _resume_file(resume_dir, arch: dict, hparams: dict, cfg: TrainConfig) -> Path | None:
    """A configuration's training state in ``resume_dir``, named after everything it depends on
    besides the data (the caller's folder is the data's)."""
    if resume_dir is None:
        return None
    key = hashlib.sha256(json.dumps([arch, hparams, repr(cfg)], sort_keys=True).encode()).hexdigest()[:16]
    return Path(resume_dir) / f"config-{key}.pt"


def _refit(base: BlackBoxLM, arch: dict, profile: Profile, chosen: dict, examples, prompt_format: str,
           cache_dir: Path | None, seed: int, progress: bool):
    """The chosen configuration trained again on every pair for its chosen number of epochs
    (no pair is held out, so nothing stops it early)."""
    everything = _objective(base, _encoded(base, examples, profile, prompt_format), cache_dir, progress)
    epochs = max(1, chosen["best_epoch"])
    model = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
    cfg = _config(profile, chosen["hparams"], seed, max_epochs=epochs, patience=epochs + 1)
    result = fit(model, everything, everything, cfg, progress=progress)
    return model, {"pairs": len(everything), "epochs": epochs, "train_loss": result.history[-1]["train_loss"]}


def _family(spec: BaseSpec) -> str:
    """The reweighter family of the base: the registry's, or LLaMA-like for anything else
    (an endpoint, a Hub id), whose 1-layer model fits any vocabulary."""
    if spec.kind == "model":
        return models.model_spec(spec.name)["family"]
    return "llama"
