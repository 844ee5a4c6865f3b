"""Reweighting models: small autoregressive LMs over the base model's vocabulary.

``make_reweighter`` builds every variant the paper uses:
- ``gpt2``: ``GPT2Config(n_layer=k)``, all else default (768 wide, 12 heads), as the authors
  used for GPT-2 bases;
- ``llama``: 1 layer, hidden 256, 1 head, intermediate 1024 (LLaMA bases);
- ``mlp`` / ``linear``: context-free models for the architecture ablation: the current token's
  embedding through a two-layer ReLU MLP, or straight through a linear head;
- ``pretrained``: a pretrained small causal LM (e.g. ``gpt2`` for GPT2-M) as initialisation.
The vocabulary always equals the base model's; ``check_vocabulary`` says what to do if not.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

ARCHITECTURES = ("gpt2", "llama", "mlp", "linear", "pretrained")


class ContextFreeReweighter(nn.Module):
    """r_t depends on the current token only: embedding -> [Linear -> ReLU] -> head.

    With ``hidden_size=None`` this is the linear variant (a low-rank bigram table).
    """

    is_context_free = True

    def __init__(self, vocab_size: int, embed_dim: int = 256, hidden_size: int | None = 1024):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        if hidden_size is None:
            self.trunk_layers = nn.Identity()
            head_in = embed_dim
        else:
            self.trunk_layers = nn.Sequential(nn.Linear(embed_dim, hidden_size), nn.ReLU())
            head_in = hidden_size
        self.lm_head = nn.Linear(head_in, vocab_size)
        self.vocab_size = vocab_size

    def trunk(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.trunk_layers(self.embed(input_ids))

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, **_ignored) -> CausalLMOutputWithPast:
        return CausalLMOutputWithPast(logits=self.lm_head(self.trunk(input_ids)))


class PairCache:
    """The KV caches of an :class:`ExpertDifference`'s two models, reordered together (beam search)."""

    def __init__(self, expert, anti_expert):
        self.caches = (expert, anti_expert)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for cache in self.caches:
            cache.reorder_cache(beam_idx)


class ExpertDifference(nn.Module):
    """Proxy-tuning's expert and anti-expert as one small model (alisawuffles/proxy-tuning,
    modeling/dexperts.py): its "logits" are log_softmax(expert) - log_softmax(anti-expert), which
    ``core.combine.proxy_combine`` adds to the base at strength alpha. ``proxy_combine`` normalises
    what it is given, which shifts a row by a constant and leaves softmax(b + alpha * d)
    unchanged, so the pair drops in wherever one expert with a uniform anti-expert did: decoding
    (each model keeps its own KV cache) and the hyper-validation loss that chooses alpha. The
    anti-expert is frozen: it is the expert's model before tuning."""

    def __init__(self, expert: nn.Module, anti_expert: nn.Module):
        super().__init__()
        self.expert, self.anti_expert = expert, anti_expert.requires_grad_(False)

    def get_output_embeddings(self) -> nn.Module:
        return self.expert.get_output_embeddings()

    @staticmethod
    def difference(expert_logits: torch.Tensor, anti_logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(expert_logits.float(), dim=-1) - F.log_softmax(anti_logits.float(), dim=-1)

    def forward(self, input_ids: torch.Tensor, past_key_values: PairCache | None = None, use_cache: bool = False,
                **kwargs) -> CausalLMOutputWithPast:
        caches = past_key_values.caches if past_key_values is not None else (None, None)
        out = [model(input_ids=input_ids, past_key_values=cache, use_cache=use_cache, **kwargs)
               for model, cache in zip((self.expert, self.anti_expert), caches)]
        return CausalLMOutputWithPast(
            logits=self.difference(out[0].logits, out[1].logits),
            past_key_values=PairCache(out[0].past_key_values, out[1].past_key_values) if use_cache else None)

    def pair_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    positions: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`reweighter_logits` of the pair: each model's, then their difference."""
        return self.difference(reweighter_logits(self.expert, input_ids, attention_mask, positions),
                               reweighter_logits(self.anti_expert, input_ids, attention_mask, positions))


def make_reweighter(
    arch: str,
    vocab_size: int,
    *,
    n_layer: int = 1,
    hidden_size: int = 256,
    num_attention_heads: int = 1,
    intermediate_size: int = 1024,
    pretrained: str | None = None,
    seed: int | None = None,
) -> nn.Module:
    """A freshly initialised (seeded) reweighting model with ``vocab_size`` outputs."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"Unknown reweighting architecture {arch!r}; choose one of {ARCHITECTURES}.")
    if seed is not None:
        torch.manual_seed(seed)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_layer=n_layer))
    elif arch == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=vocab_size,
                num_hidden_layers=n_layer,
                hidden_size=hidden_size,
                num_attention_heads=num_attention_heads,
                num_key_value_heads=num_attention_heads,
                intermediate_size=intermediate_size,
            )
        )
    elif arch == "mlp":
        model = ContextFreeReweighter(vocab_size, hidden_size, intermediate_size)
    elif arch == "linear":
        model = ContextFreeReweighter(vocab_size, hidden_size, None)
    else:
        if not pretrained:
            raise ValueError("arch='pretrained' needs pretrained=<Hub id or local directory>.")
        model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32)
    check_vocabulary(vocab_size, model)
    return model


def output_vocab_size(model: nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


BUILD_ADVICE = (
    "build the reweighting model with plugin_lib.make_reweighter(arch, vocab_size=base.vocab_size) "
    "(plugin_lib.core.reweighter), or pick a pretrained model that uses the base model's tokenizer."
)


def check_vocabulary(base_vocab_size: int, reweighter: nn.Module) -> None:
    """Raise a ValueError that says what to do when the two vocabularies differ."""
    size = output_vocab_size(reweighter)
    if size != base_vocab_size:
        raise ValueError(
            f"Vocabulary mismatch: the base model scores {base_vocab_size} tokens, the reweighting "
            f"model {size}. The product b * r needs one shared vocabulary: {BUILD_ADVICE}"
        )


def check_token_ids(largest_id: int, reweighter: nn.Module) -> None:
    """Raise a ValueError that says what to do when the reweighting model has no output (and
    no embedding) for token ids up to ``largest_id``."""
    size = output_vocab_size(reweighter)
    if largest_id >= size:
        raise ValueError(
            f"Token id {largest_id} is outside the reweighting model's vocabulary of {size} tokens: "
            f"{BUILD_ADVICE}"
        )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding, as transformers' generate computes them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def reweighter_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits (B, T, V), or (N, V) at the True entries of ``positions`` only.

    The output head is the bulk of a small model's cost (256 x 49k for SmolLM2's vocabulary),
    so training computes it only where the loss needs it.
    """
    if isinstance(model, ExpertDifference):
        return model.pair_logits(input_ids, attention_mask, positions)
    if getattr(model, "is_context_free", False):
        hidden = model.trunk(input_ids)
    else:
        hidden = model.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
        ).last_hidden_state
    if positions is not None:
        hidden = hidden[positions]
    return model.get_output_embeddings()(hidden)


HEAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class LowPrecisionHead(nn.Module):
    """An output layer that multiplies in a narrower dtype and returns float32 logits."""

    def __init__(self, head: nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)
        self.bias = None if head.bias is None else nn.Parameter(head.bias.detach().to(dtype), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.to(self.weight.dtype), self.weight, self.bias).float()


def for_decoding(model: nn.Module, head_dtype: str = "float32") -> nn.Module:
    """The reweighting model as decoding runs it: ``model`` itself at ``float32``; at
    ``bfloat16``, a copy whose output layer (V x d, the bulk of a small model's bytes) computes
    in bfloat16. Decoding a batch reads the whole head at every step, so its bytes set the
    step's cost; halving them is an approximation (logits to about 3 significant digits), opt-in,
    never used by the experiments or by training. ``model`` is left as it is (it is what gets
    saved). The copy shares the body's weights with ``model``, and only its head is new, so it costs
    the bfloat16 head's bytes and no more; it is for decoding, not for training."""
    if head_dtype not in HEAD_DTYPES:
        raise ValueError(f"Unknown head dtype {head_dtype!r}; choose one of {tuple(HEAD_DTYPES)}.")
    if head_dtype == "float32":
        return model
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"A {head_dtype} head needs an output layer that is one nn.Linear; this reweighting "
                         f"model's is a {type(head).__name__}: use float32.")
    if head.weight.device.type == "cpu" and not (torch.cpu._is_avx512_bf16_supported()
                                                  or torch.cpu._is_amx_tile_supported()):
        warnings.warn("This CPU has no bfloat16 instructions (AVX512-BF16 or AMX): a bfloat16 head is slower "
                      "here than float32.", stacklevel=2)
    # The memo makes deepcopy reuse every parameter: new modules around the same weights.
    decoder = copy.deepcopy(model, memo={id(p): p for p in model.parameters()}).eval()
    low = LowPrecisionHead(head, HEAD_DTYPES[head_dtype])
    if isinstance(decoder, ContextFreeReweighter):
        decoder.lm_head = low
    else:
        decoder.set_output_embeddings(low)
    return decoder


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
