"""A Plugin trained on a user's own (prompt, completion) pairs, by the paper's protocol.

The file is JSONL (one object per line) or CSV, with the columns ``prompt`` and ``completion``.
Pairs are grouped by unique prompt and divided 60/40 into a training part and a
hyper-validation part (``data.split_hyper_validation``, as for the paper's datasets). Every
configuration of the recipe's grid (learning rate x weight decay; ``recipe.TrainingRecipe``, a
profile's or one's own) is trained with its budget (AdamW, warmup, early stopping on
hyper-validation loss), a choice at an edge pushes the grid further as the runner does
(``core.grid_search.beyond_edge``), and the configuration with the lowest hyper-validation loss
is kept. The base's outputs are computed once for all of them (and
kept for a later run on the same pairs), and the configurations train together, each batch read
once for all (``core.train.fit_grid``); an interrupted run resumes each configuration where it
stopped; then the choice is trained again on every pair (``refit``, the default), so the saved
model has seen all the data.
"""
from __future__ import annotations

from pathlib import Path

from ..core import grid_search
from ..core.blackbox import BlackBoxLM
from ..core.pairs import encode_pairs
from ..data.datasets import Example, split_hyper_validation, training_pairs
from ..data.prompts import format_for_model
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


def train_plugin(base: BlackBoxLM, base_spec: BaseSpec, pairs: list[Pair], recipe: TrainingRecipe, *,
                 progress: bool = True, cache_dir: str | Path | None = None, resume_dir: str | Path | None = None,
                 announce=None) -> PluginModel:
    """A ``PluginModel`` trained on ``pairs`` as the recipe says: its grid, budget, seed, prompt
    format and reweighting model (a profile's: ``TrainingRecipe.from_profile``). With its
    ``refit`` (the default), the chosen configuration trains again on all pairs for the chosen
    number of epochs, so the saved model has seen every pair (scikit-learn's ``refit=True``).

    ``cache_dir``: where the base's outputs are kept and found again by a later run on the same
    pairs. ``resume_dir``: every configuration's training state, so an interrupted call resumes
    where it stopped (the caller removes it when done). ``announce``: gets the whole cost's
    estimate (``core.train_estimate``) before any work."""
    seed, refit = recipe.seed, recipe.refit
    values, config = recipe.grid(), recipe.train_config(seed)
    arch = dict(recipe.arch) if recipe.arch else base_spec.reweighter_arch()
    decoding = DecodingSettings(max_new_tokens=recipe.max_new_tokens, repetition_penalty=recipe.repetition_penalty,
                                prompt_format=recipe.prompt_format, max_prompt_tokens=recipe.max_prompt_tokens)
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    train, hyper = split_hyper_validation(as_examples(pairs), seed=seed)
    examples = training_pairs(train + hyper)  # train's pairs first, then hyper's
    split = len(training_pairs(train))
    prompts = [format_for_model(ex.source, base.tokenizer, recipe.prompt_format == "chat") for ex, _ in examples]
    encoded = encode_pairs(base.tokenizer, prompts, [reference for _, reference in examples],
                           max_prompt_tokens=recipe.max_prompt_tokens, max_target_tokens=recipe.max_target_tokens)
    planned = None
    if announce is not None:  # before any work: the whole cost, timed here
        planned = grid_search.estimate(base, arch, encoded, split, values, config, extend_edges=recipe.extend_edges,
                                       cache_dir=cache_dir, resume_dir=resume_dir, refit=refit)
        announce(planned.describe())
    model, trained = grid_search.train_on_pairs(
        base, arch, encoded, split, values, config, extend_edges=recipe.extend_edges,
        cache_dir=cache_dir, resume_dir=resume_dir, refit=refit, progress=progress)
    record = {"pairs": len(pairs), "prompts": len(train) + len(hyper), "data_sha256": data_sha256(pairs),
              "profile": recipe.name, "seed": seed, "arch": arch, "max_epochs": recipe.max_epochs, "grid": values,
              **trained}
    if planned is not None:
        record["estimate"] = planned.as_record()
    record["package_version"] = package_version()
    return PluginModel(base, model, base_spec=base_spec, decoding=decoding, training=record)
