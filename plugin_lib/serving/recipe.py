"""How the user's ``train`` trains a Plugin: a ``TrainingRecipe``.

The Plugin trained on a user's own pairs needs a grid (learning rates, weight decays, how far a
choice at an edge pushes it), a training budget, token limits and decoding defaults. A profile of
``profiles.yaml`` supplies them (:meth:`TrainingRecipe.from_profile`, what ``plugin-repro train
--profile`` does), but a recipe can be written by hand too: training on one's own model does not
go through the paper's ``Profile``. Three choices no profile makes have defaults: how prompts are
shown to the base, the reweighting model, and whether the choice is trained again on every pair.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.train import TrainConfig
from ..harness.profile import Profile
from ..harness.running.run_keys import grid_keys
from .artifact import PROMPT_FORMATS


@dataclass(frozen=True, kw_only=True)
class TrainingRecipe:
    """Every setting a profile holds is given (they live in profiles.yaml; ``from_profile`` reads
    them); the last four have defaults."""

    lr: tuple[float, ...]           # learning rates searched
    weight_decay: tuple[float, ...]  # weight decays searched
    extend_edges: int               # how many steps a choice at an edge of the grid may push that edge
    max_epochs: int                 # the training budget, per configuration
    patience: int                   # epochs without a better hyper-validation loss before stopping
    batch_size: int
    warmup_ratio: float
    seed: int                       # of the 60/40 split and of training
    max_prompt_tokens: int          # prompts and targets are cut to these when training
    max_target_tokens: int
    max_new_tokens: int             # the trained artifact's decoding defaults
    repetition_penalty: float
    name: str = "custom"            # where it came from (a profile's name), recorded with the model
    prompt_format: str = "plain"    # "chat": each prompt one user turn of the tokenizer's chat template
    arch: dict | None = None        # the reweighting model (None: the authors' for the base's family)
    refit: bool = True              # train the choice again on every pair, as scikit-learn's refit=True

    def __post_init__(self):
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"Unknown prompt_format {self.prompt_format!r}; choose one of {PROMPT_FORMATS}.")
        if not self.lr or not self.weight_decay:
            raise ValueError("a recipe needs at least one learning rate and one weight decay.")
        if any(x <= 0 for x in self.lr) or any(x < 0 for x in self.weight_decay):
            raise ValueError("learning rates must be positive and weight decays at least 0.")
        if self.max_epochs < 1 or self.batch_size < 1 or self.extend_edges < 0:
            raise ValueError("max_epochs and batch_size must be at least 1, extend_edges at least 0.")

    @classmethod
    def from_profile(cls, profile: Profile) -> TrainingRecipe:
        """The profile's grid, training budget, first seed, token limits and decoding defaults (the
        other three: their defaults)."""
        return cls(lr=tuple(profile.grid.lr), weight_decay=tuple(profile.grid.weight_decay),
                   extend_edges=profile.grid.extend_edges, max_epochs=profile.training.max_epochs,
                   patience=profile.training.patience, batch_size=profile.training.batch_size,
                   warmup_ratio=profile.training.warmup_ratio, seed=profile.seeds[0],
                   max_prompt_tokens=profile.tokens.max_prompt, max_target_tokens=profile.tokens.max_target,
                   max_new_tokens=profile.decoding.max_new_tokens,
                   repetition_penalty=profile.decoding.repetition_penalty, name=profile.name)

    def replace(self, **changes) -> TrainingRecipe:
        return dataclasses.replace(self, **changes)

    def grid(self) -> dict[str, list[float]]:
        """The values searched, one list per hyperparameter in the runner's order (the search may
        push them further: ``core.grid_search``)."""
        return {k: list(getattr(self, k)) for k in grid_keys("Plugin")}

    def train_config(self, seed: int) -> TrainConfig:
        """The training budget of every configuration (``core.grid_search.with_hparams`` sets
        its learning rate and weight decay)."""
        return TrainConfig(lr=self.lr[0], weight_decay=self.weight_decay[0], seed=seed, max_epochs=self.max_epochs,
                           patience=self.patience, batch_size=self.batch_size, warmup_ratio=self.warmup_ratio)
