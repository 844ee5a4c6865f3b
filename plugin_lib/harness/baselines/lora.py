"""LoRA, the white-box reference of the paper's Table 8.

The paper puts rank-8 LoRA on the query and value projections of the base model and
fine-tunes it on the same task data as the Plugin. Here:

- Targets: peft's own LoRA defaults, which are the query and value projections: ``q_proj``
  and ``v_proj`` for LLaMA-family models (SmolLM2 included), ``c_attn`` for GPT-2. GPT-2 fuses
  the query, key and value projections into one ``c_attn`` layer (a ``Conv1D``, hence
  ``fan_in_fan_out=True``), and peft 0.21 has no way to adapt only some output slices of a
  layer (the old ``enable_lora`` option is gone), so on GPT-2 the low-rank update also
  reaches the keys. The trainable-parameter count is the same either way: r * (d + 3d)
  for the fused layer equals 2 * r * (d + d) for separate q and v, which gives the paper's
  2.46M for GPT2-XL (48 layers, d = 1600, r = 8).
- Training: the same loop and model selection as every other method, ``train.fit`` with a
  ``TokenObjective`` (``fit_lora``). The LoRA model's own output distribution is the
  prediction, as for NewModel, so the objective uses ``small_model_log_probs`` and no
  base-output cache. ``fit`` is given ``peft_model.get_base_model()``: the transformers
  model with the LoRA layers injected, whose ``base_model`` / ``get_output_embeddings`` are
  what ``models.reweighter_logits`` calls (the PeftModel itself answers ``base_model`` with
  peft's LoraModel, which returns logits, not hidden states).
- Decoding: the adapted model is white box, so it goes through ``BlackBoxLM`` and
  ``decode.generate`` like any base (``lora_black_box``). By default the adapters are merged
  into the weights first (``merge_and_unload``): same outputs up to rounding, no adapter
  cost per token. Merging rewrites the wrapped model's weights in place, so the LoRA model
  must not share its base with the black-box experiments (load a separate copy).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ...core.blackbox import BlackBoxLM
from ...core.pairs import EncodedPair
from ...core.train import FitResult, TokenObjective, TrainConfig, fit, small_model_log_probs

FUSED_QKV_MODEL_TYPES = ("gpt2",)  # their attention projection is one Conv1D layer


def lora_targets(model: PreTrainedModel) -> list[str]:
    """Names of the query and value projection layers of ``model`` (peft's LoRA defaults)."""
    model_type = model.config.model_type
    if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
        raise ValueError(f"No known query/value projections for model type {model_type!r}.")
    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type])


def add_lora(
    model: PreTrainedModel, r: int = 8, alpha: int = 16, dropout: float = 0.05, *, seed: int | None = None
) -> PeftModel:
    """``model`` with rank-``r`` LoRA on its query and value projections; only the adapters train.

    ``seed`` fixes the random initialisation of the A matrices (B starts at zero, so the
    adapted model starts equal to the base).
    """
    if seed is not None:
        torch.manual_seed(seed)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=lora_targets(model),
        fan_in_fan_out=model.config.model_type in FUSED_QKV_MODEL_TYPES,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def checkpoint_activations(model: PreTrainedModel) -> None:
    """Recompute each block's activations in the backward pass instead of keeping them
    (transformers' gradient checkpointing): the same loss and gradients (the random state of
    dropout is replayed) for about a third more compute, and a GPU holds one block's activations
    instead of every block's. LoRA on a GPU uses it: GPT2-XL's Table 8 training then fits a T4."""
    kwargs = {"use_reentrant": False}  # frozen inputs: the re-entrant variant would need them to want gradients
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def lora_objective(pairs: Sequence[EncodedPair], pad_token_id: int) -> TokenObjective:
    """Token NLL of the LoRA model's own distribution over the target tokens."""
    return TokenObjective(pairs, pad_token_id, log_probs=small_model_log_probs)


def fit_lora(
    peft_model: PeftModel, train: TokenObjective, val: TokenObjective, cfg: TrainConfig, *, progress: bool = True
) -> FitResult:
    """``train.fit`` on the adapters: the same schedule, early stopping and best-epoch restore.

    ``fit`` keeps a copy of the full state dict at every improvement, frozen base weights
    included: fine for small bases, a full extra copy of the model for large ones.
    """
    return fit(peft_model.get_base_model(), train, val, cfg, progress=progress)


def lora_black_box(
    peft_model: PeftModel, tokenizer: PreTrainedTokenizerBase, *, merge: bool = True, name: str = "lora"
) -> BlackBoxLM:
    """The adapted model behind the black-box interface, for ``decode.generate``.

    With ``merge`` the adapters are folded into the weights (in place) and the plain
    transformers model is wrapped; without, the PeftModel itself.
    """
    model = peft_model.merge_and_unload() if merge else peft_model
    return BlackBoxLM(model, tokenizer, name)


# ---------------------------------------------------------------- the adapters as a small model


class LoraModel(nn.Module):
    """A PeftModel seen as a small model: ``fit`` and ``TokenObjective`` train it unchanged.

    ``base_model`` and ``get_output_embeddings`` answer as a reweighting model's do. The state
    dict holds only the adapters (the base is its public checkpoint), so ``fit``'s best-epoch
    copies and the runner's stored weights stay megabytes, not a copy of the base.
    """

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        self.peft = peft_model

    @property
    def base_model(self) -> nn.Module:
        return self.peft.get_base_model().base_model

    def get_output_embeddings(self) -> nn.Module:
        return self.peft.get_output_embeddings()

    def state_dict(self, *args, **kwargs) -> dict:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.peft)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        from peft import set_peft_model_state_dict

        if strict and set(state_dict) != set(self.state_dict()):
            raise KeyError("The state dict does not hold exactly this model's LoRA adapters.")
        return set_peft_model_state_dict(self.peft, state_dict)




def lora_on(model: nn.Module, seed: int, recompute: bool | None = None) -> LoraModel:
    """Rank-8 LoRA put into ``model``'s own weights, its activations recomputed where
    ``recompute`` says (None: on a GPU): how every LoRA run trains (``make_lora``, with the
    task's ``lora_recompute``), and what the preflight times (``preflight_rates``)."""
    if next(model.parameters()).device.type == "cuda" if recompute is None else recompute:
        checkpoint_activations(model)
    return LoraModel(add_lora(model, seed=seed))
