"""A task: one dataset on one base model at a profile's scale: its splits (the validation subset
divided 60/40 into training and hyper-validation parts, and the test subset or fresh test
inputs), prompts, encoded pairs and base-output caches, built on first use and shared by every
method, seed and hyperparameter setting (``harness.methods`` trains and decodes on it;
``harness.running.runner.load_task`` makes it, with the cache under the runs folder)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import data
from ..core.blackbox import BlackBoxLM
from ..core.cache import BaseOutputCache
from ..core.pairs import EncodedPair, encode_pairs
from ..data import prompts
from ..utils.locks import StoreLock
from . import models
from .planning import preflight_counts
from .profile import Profile, TempNetSettings


@dataclass
class Task:
    """One dataset on one base model: the splits, prompts, encoded pairs and base-output caches.

    The caches are built on first use and shared by every method, seed and hyperparameter
    setting that needs the base's outputs on the training data.
    """

    base: BlackBoxLM
    dataset: str
    family: str
    train: list[data.Example]
    hyper: list[data.Example]
    test: list[data.Example]
    max_prompt_tokens: int = 128
    max_target_tokens: int = 127
    use_chat_template: bool = False
    cache_dir: Path | None = None
    prompt_prefix: str = ""  # e.g. a discrete prompt learned by BDPL, put before the task prompt
    prompt_style: str = "authors"  # data.prompts.STYLES; the profile's ``prompts``
    tempnet: TempNetSettings | None = None  # the profile's, for TempNet (make_task sets it)
    cache_layout: str = "auto"  # the profile's (core.cache.BaseOutputCache.build)
    static_decoding: bool = False  # decode.generate's static_cache: the profile's "gpu" with the base on one
    stacked_training: bool = False  # fit_grid's stack: the profile's "gpu" with the base on one
    # Whether LoRA recomputes activations (on a GPU where its planned peak needs it), asked when LoRA
    # is built: asking the base's device earlier would load a lazy base (a fine-tuned one) for nothing.
    lora_recompute_rule: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    # Encoded pairs and base-output caches, built on first use; per task, so they go with it.
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def lora_recompute(self) -> bool:
        return bool(self.lora_recompute_rule and self.lora_recompute_rule())

    def prompt(self, example: data.Example, demonstrations=()) -> str:
        text = prompts.build_prompt(self.dataset, self.family, example.source, demonstrations, self.prompt_style)
        if self.prompt_prefix:
            text = f"{self.prompt_prefix} {text}"
        return prompts.format_for_model(text, self.base.tokenizer, self.use_chat_template)

    def demonstrations(self, k: int, seed: int) -> list[list[tuple[data.Example, str]]]:
        """Each test input's ICL demonstrations in the task's prompt style: the authors' one
        draw from the validation rows (training and hyper-validation parts) for every input and
        seed, or the appendix scheme's draw per seed and input from the training part."""
        if self.prompt_style == "authors":
            shared = prompts.authors_demonstrations(self.train + self.hyper, k)
            return [shared] * len(self.test)
        return [prompts.sample_demonstrations(self.train, k, seed=seed * 100_003 + i) for i in range(len(self.test))]

    def encoded(self, split: str) -> list[EncodedPair]:
        """(prompt, reference) pairs of ``split`` ("train" or "hyper") as token ids."""
        key = ("encoded", split)
        if key not in self._memo:
            pairs = data.training_pairs(getattr(self, split))
            self._memo[key] = encode_pairs(
                self.base.tokenizer,
                [self.prompt(ex) for ex, _ in pairs],
                [reference for _, reference in pairs],
                max_prompt_tokens=self.max_prompt_tokens,
                max_target_tokens=self.max_target_tokens,
            )
        return self._memo[key]

    def base_cache(self, split: str) -> BaseOutputCache:
        """The frozen base's outputs on ``split``, computed once for all methods and seeds."""
        key = ("cache", split)
        if key not in self._memo:
            if self.cache_dir is None:
                self._memo[key] = BaseOutputCache.build(self.base, self.encoded(split), layout=self.cache_layout)
            else:  # built once: a second process waits for the first, then reads its files
                name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.base.name)
                with StoreLock(Path(self.cache_dir) / ".locks" / f"{name}.lock"):
                    self._memo[key] = BaseOutputCache.build(self.base, self.encoded(split), directory=self.cache_dir,
                                                            layout=self.cache_layout)
        return self._memo[key]


def task_splits(dataset: str, profile: Profile, seed: int = 0
                ) -> tuple[list[data.Example], list[data.Example], list[data.Example]]:
    """(train, hyper, test) at the profile's scale: the validation subset divided 60/40 by
    unique input, and the test subset (or fresh test inputs: :func:`fresh_test_inputs`). Every
    task of ``dataset`` under ``profile`` has these."""
    rows = profile.rows
    validation = data.load_dataset(dataset, "validation", rows=rows.validation)
    train, hyper = data.split_hyper_validation(validation, frac=0.4, seed=seed)
    if profile.test_inputs is None:
        return train, hyper, data.load_dataset(dataset, "test", rows=rows.test)
    return train, hyper, fresh_test_inputs(dataset, profile, train + hyper)


def fresh_test_inputs(dataset: str, profile: Profile, training: list[data.Example]) -> list[data.Example]:
    """``rows.test`` test inputs that no profile of ``test_inputs.fresh_from`` decodes, drawn
    with ``test_inputs.seed`` (``profile.TestInputs``): first from the rest of the test split,
    then, where that is too small and the profile allows it, from validation inputs that no
    profile named decodes or trains on, nor this one. A candidate whose reference is also a
    reference of ``training`` (exact text) is left out when ``dedupe_references`` is set."""
    from .profile import load_profile  # the other profiles' scale, read from profiles.yaml

    spec, wanted = profile.test_inputs, profile.rows.test
    decoded, trained = set(), {ex.id for ex in training}
    for name in spec.profiles:
        other = load_profile(name)
        decoded |= {ex.id for ex in task_splits(dataset, other)[2]}  # its own fresh inputs, where it has them
        trained |= {ex.id for ex in data.load_dataset(dataset, "validation", rows=other.rows.validation)}
    seen = {" ".join(ref.split()) for ex in training for ref in ex.references} if spec.dedupe_references else set()

    def fresh(examples: list[data.Example], excluded: set[str]) -> list[data.Example]:
        return [ex for ex in examples if ex.id not in excluded
                and not any(" ".join(ref.split()) in seen for ref in ex.references)]

    chosen = data.subset(fresh(data.load_dataset(dataset, "test"), decoded), wanted, spec.seed)
    if spec.fill_from_validation and wanted is not None and len(chosen) < wanted:
        chosen += data.subset(fresh(data.load_dataset(dataset, "validation"), trained | decoded),
                              wanted - len(chosen), spec.seed)
    return chosen


def make_task(base: BlackBoxLM, dataset: str, profile: Profile, *, prompt_model: str | None = None,
              cache_dir: Path | None = None, seed: int = 0) -> Task:
    """The task's splits at the profile's scale (:func:`task_splits`).
    ``prompt_model``: the model whose prompt family and chat format to use (default: the base).
    ``harness.running.runner.load_task`` is the entry point; it puts the cache under the runs folder."""
    train, hyper, test = task_splits(dataset, profile, seed)
    spec = models.model_spec(prompt_model or base.name)
    return Task(
        base=base,
        dataset=dataset,
        family=spec["family"],
        train=train,
        hyper=hyper,
        test=test,
        max_prompt_tokens=profile.tokens.max_prompt,
        max_target_tokens=profile.tokens.max_target,
        use_chat_template=spec.get("chat_template", False),
        cache_dir=cache_dir,
        prompt_style=profile.prompts,
        tempnet=profile.tempnet,
        cache_layout=profile.cache_layout,
        static_decoding=profile.static_decoding == "gpu" and base.device.type == "cuda",
        stacked_training=profile.stacked_training == "gpu" and base.device.type == "cuda",
        lora_recompute_rule=functools.partial(_lora_recompute, base, profile),
    )


def _lora_recompute(base: BlackBoxLM, profile: Profile) -> bool:
    """LoRA recomputes its activations on a GPU whose memory its planned peak without them
    exceeds (``preflight_counts.lora_recompute``); a base whose shape cannot be counted here does."""
    if base.device.type != "cuda":
        return False
    try:
        total = torch.cuda.get_device_properties(base.device).total_memory
        return preflight_counts.lora_recompute(base.states_name, profile, total)
    except (ValueError, OSError):  # not a registry model nor a Hub id whose configuration is here
        return True


def tempnet_settings(task: Task) -> TempNetSettings:
    if task.tempnet is None:
        raise ValueError("This task has no TempNet settings: make it with make_task / runner.load_task (the "
                         "profile's `tempnet` section), or pass Task(..., tempnet=profile.tempnet).")
    return task.tempnet
