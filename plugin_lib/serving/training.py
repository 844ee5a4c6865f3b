"""A Plugin trained on a user's own (prompt, completion) pairs, by the paper's protocol.

The file is JSONL (one object per line) or CSV, with the columns ``prompt`` and ``completion``.
Pairs are grouped by unique prompt and divided 60/40 into a training part and a
hyper-validation part (``data.split_hyper_validation``, as for the paper's datasets). Every
configuration of the profile's grid (learning rate x weight decay) is trained with the profile's
budget (AdamW, warmup, early stopping on hyper-validation loss), a choice at an edge pushes the
grid further as the runner does (``harness.runner.beyond_edge``), and the configuration with the
lowest hyper-validation loss is kept. The base's outputs are computed once for all of them.
"""
from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..core.blackbox import BlackBoxLM
from ..core.reweighter import make_reweighter
from ..core.train import BaseOutputCache, TokenObjective, TrainConfig, encode_pairs, fit, reachable_plugin_log_probs
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


def train_plugin(base: BlackBoxLM, base_spec: BaseSpec, pairs: list[Pair], profile: Profile, *,
                 prompt_format: str = "plain", seed: int | None = None, arch: dict | None = None,
                 progress: bool = True) -> PluginModel:
    """A ``PluginModel`` trained on ``pairs`` by the profile's grid and budget."""
    seed = profile.seeds[0] if seed is None else seed
    arch = arch or models.reweighter_spec(_family(base_spec))
    decoding = DecodingSettings(max_new_tokens=profile.decoding.max_new_tokens,
                                repetition_penalty=profile.decoding.repetition_penalty,
                                prompt_format=prompt_format, max_prompt_tokens=profile.tokens.max_prompt)
    train, hyper = split_hyper_validation(as_examples(pairs), seed=seed)
    objectives = {}
    for part, examples in (("train", train), ("hyper", hyper)):
        encoded = encode_pairs(base.tokenizer, [format_for_model(ex.source, base.tokenizer, prompt_format == "chat")
                                for ex, _ in training_pairs(examples)],
                               [reference for _, reference in training_pairs(examples)],
                               max_prompt_tokens=profile.tokens.max_prompt, max_target_tokens=profile.tokens.max_target)
        cache = BaseOutputCache.build(base, encoded, progress=progress)
        objectives[part] = TokenObjective(encoded, base.tokenizer.pad_token_id, log_probs=reachable_plugin_log_probs,
                                          cache=cache)

    values = {k: list(getattr(profile.grid, k)) for k in runner.grid_keys("Plugin")}
    results: dict[tuple, dict] = {}
    best = None
    extensions = {k: 0 for k in values}
    started = time.perf_counter()
    while True:
        todo = [h for h in runner.hparam_grid(profile, "Plugin", values) if tuple(sorted(h.items())) not in results]
        for hparams in tqdm(todo, desc="grid", disable=not progress):
            model = make_reweighter(vocab_size=base.vocab_size, seed=seed, **arch).to(base.device)
            cfg = TrainConfig(lr=hparams["lr"], weight_decay=hparams["weight_decay"], seed=seed,
                              max_epochs=profile.training.max_epochs, patience=profile.training.patience,
                              batch_size=profile.training.batch_size, warmup_ratio=profile.training.warmup_ratio)
            result = fit(model, objectives["train"], objectives["hyper"], cfg, progress=progress)
            results[tuple(sorted(hparams.items()))] = {"hparams": hparams, "val_loss": result.best_val_loss,
                                                      "best_epoch": result.best_epoch, "epochs_run": result.epochs_run}
            if best is None or result.best_val_loss < best[1]["val_loss"]:
                best = (model, results[tuple(sorted(hparams.items()))])
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
        "grid": values, "configs": list(results.values()), "hparams": chosen["hparams"],
        "val_loss": chosen["val_loss"], "best_epoch": chosen["best_epoch"],
        "seconds": round(time.perf_counter() - started, 1), "package_version": package_version(),
    }
    return PluginModel(base, model.eval(), base_spec=base_spec, decoding=decoding, training=record)


def _family(spec: BaseSpec) -> str:
    """The reweighter family of the base: the registry's, or LLaMA-like for anything else
    (an endpoint, a Hub id), whose 1-layer model fits any vocabulary."""
    if spec.kind == "model":
        return models.model_spec(spec.name)["family"]
    return "llama"
