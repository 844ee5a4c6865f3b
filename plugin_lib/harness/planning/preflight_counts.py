"""The preflight's counting: pairs and tokens of a task as the runner encodes them, the shapes of
the bases (from their configurations, without weights), the dtypes they load in, and what that
makes on disk and in GPU memory: base-output caches in their layout, and the peaks of building
a cache, decoding, training a reweighting model, fine-tuning and LoRA (``harness.planning.preflight``).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig

from ... import data
from ...core.reweighter import count_parameters, make_reweighter
from ...core.cache import cache_dtype, choose_layout, gpu_headroom, host_available_bytes
from ...data import prompts
from .. import models
from .. import profile as config
from .gpus import GpuClass
from ..profile import Profile

GIB = 2**30


@dataclass(frozen=True)
class TaskCounts:
    """One (dataset, prompt family) at the profile's scale, counted with one tokenizer."""

    train_pairs: int
    hyper_pairs: int
    target_tokens: int  # train + hyper, EOS included: the rows of the base-output caches
    pair_tokens: float  # mean prompt + target tokens of a training pair
    test_inputs: int
    prompt_tokens: float  # mean test-prompt tokens

    @property
    def pairs(self) -> int:
        return self.train_pairs + self.hyper_pairs


@functools.lru_cache(maxsize=None)
def tokenizer_for(model: str):
    """(tokenizer, exact?): the model's own where it loads offline, else SmolLM2's."""
    spec = models.model_spec(model)
    if spec["source"] == "hub":
        try:
            return AutoTokenizer.from_pretrained(spec["hub_id"], **models.hub_kwargs(spec["hub_id"])), True
        except Exception:  # not in the local Hub cache, or no Hub: the stand-in counts
            return _smollm2_tokenizer(), False
    return _smollm2_tokenizer(), True  # the twins use it; SmolLM2's own is the same


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    return models.twin_tokenizer()


@functools.lru_cache(maxsize=None)
def _splits(dataset: str, rows: config.Rows) -> tuple[list, list, list]:
    validation = data.load_dataset(dataset, "validation", rows=rows.validation)
    train, hyper = data.split_hyper_validation(validation, frac=0.4, seed=0)
    return train, hyper, data.load_dataset(dataset, "test", rows=rows.test)


_LENGTHS: dict[tuple[int, bool], dict[str, int]] = {}


def _token_lengths(tokenizer, texts: Sequence[str], special: bool) -> list[int]:
    """Token counts of ``texts``, each distinct text tokenised once per tokenizer (pairs share
    prompts: a dataset has several references per input, and its models share references)."""
    known = _LENGTHS.setdefault((id(tokenizer), special), {})
    new = list(dict.fromkeys(t for t in texts if t not in known))
    if new:
        ids = tokenizer(new, add_special_tokens=special, return_attention_mask=False)["input_ids"]
        known.update(zip(new, map(len, ids)))
    return [known[t] for t in texts]


def count_task(dataset: str, model: str, profile: Profile) -> TaskCounts:
    """Pairs and tokens of ``dataset`` as the runner encodes them for ``model``
    (``core.pairs.encode_pairs``: the prompt's last ``max_prompt`` tokens, the target's first
    ``max_target`` and EOS)."""
    spec = models.model_spec(model)
    _splits(dataset, profile.rows)  # missing data is said before a first run converts a tokenizer
    tokenizer, _ = tokenizer_for(model)
    return _count(dataset, spec["family"], bool(spec.get("chat_template", False)), profile.prompts, id(tokenizer),
                  profile.rows, profile.tokens, tokenizer)


@functools.lru_cache(maxsize=None)
def _count(dataset: str, family: str, chat: bool, style: str, _tokenizer_id: int, rows: config.Rows,
           tokens: config.Tokens, tokenizer) -> TaskCounts:
    train, hyper, test = _splits(dataset, rows)

    def prompt(ex):
        return prompts.format_for_model(prompts.build_prompt(dataset, family, ex.source, style=style), tokenizer, chat)

    pairs = data.training_pairs(train) + data.training_pairs(hyper)
    prompt_lengths = [min(n, tokens.max_prompt) for n in _token_lengths(tokenizer, [prompt(ex) for ex, _ in pairs], True)]
    target_lengths = [min(n, tokens.max_target) + 1 for n in _token_lengths(tokenizer, [r for _, r in pairs], False)]
    test_lengths = [min(n, tokens.max_prompt) for n in _token_lengths(tokenizer, [prompt(ex) for ex in test], True)]
    return TaskCounts(
        train_pairs=len(data.training_pairs(train)), hyper_pairs=len(data.training_pairs(hyper)),
        target_tokens=sum(target_lengths),
        pair_tokens=float(np.mean(prompt_lengths) + np.mean(target_lengths)) if pairs else 0.0,
        test_inputs=len(test), prompt_tokens=float(np.mean(test_lengths)) if test_lengths else 0.0,
    )


# ---------------------------------------------------------------- shapes and memory


@functools.lru_cache(maxsize=None)
def shape_model(model: str) -> str:
    """The model whose configuration stands for ``model``'s shape: its full-size twin
    (``twin`` in the registry) for a Hub model, otherwise the model itself."""
    spec = models.model_spec(model)
    return spec.get("twin", model)


@functools.lru_cache(maxsize=None)
def base_shape(model: str) -> dict:
    """Parameters, vocabulary, layers, KV width and hidden sizes of a base, without weights."""
    cfg = models.model_config(shape_model(model))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return {
        "params": sum(p.numel() for p in meta.parameters()),
        "vocab": meta.get_output_embeddings().weight.shape[0],
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "intermediate": getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size,
        "kv_width": kv_heads * head_dim,
    }


@functools.lru_cache(maxsize=None)
def reweighter_params(model: str, arch_items: tuple = ()) -> int:
    arch = dict(arch_items) or models.arch_for(model)
    with torch.device("meta"):
        return count_parameters(make_reweighter(vocab_size=base_shape(model)["vocab"], **arch))


# The public shapes of the families' small models (profiles.yaml's small_model: hub_id), to
# count their parameters without the Hub: GPT2-Small is GPT2Config's default; LLaMA-3.2-1B's config.json.
EXPERT_CONFIGS = {
    "gpt2": GPT2Config(),
    "meta-llama/Llama-3.2-1B": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                           num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                           tie_word_embeddings=True),
}


@functools.lru_cache(maxsize=None)
def pretrained_params(model: str, source: str, n_layers: int | None) -> int:
    """Parameters of the pretrained small model ``source`` (an ``EXPERT_CONFIGS`` name), or of
    ``model`` cut to its first ``n_layers`` blocks (``harness.baselines.variants.truncated_pretrained``)."""
    if source in EXPERT_CONFIGS:
        cfg = EXPERT_CONFIGS[source]
    else:
        cfg = models.model_config(shape_model(model))
        cfg.num_hidden_layers = n_layers
    with torch.device("meta"):
        return count_parameters(AutoModelForCausalLM.from_config(cfg))


def load_dtype(model: str, profile: Profile, gpu: bool | GpuClass) -> torch.dtype:
    """The dtype ``model`` loads in; ``gpu``: True for this machine's GPU, or a named GPU class."""
    bf16 = gpu.bf16 if isinstance(gpu, GpuClass) else _bf16()
    return models.resolve_dtype(model, profile.dtype, "cuda" if gpu else "cpu", bf16_supported=bf16)


def _bf16() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()) or not torch.cuda.is_available()


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _full_cache_bytes(model: str, target_tokens: int, profile: Profile, gpu: bool | GpuClass) -> int:
    """V log-probabilities a target token, in the cache's dtype."""
    return target_tokens * base_shape(model)["vocab"] * dtype_bytes(cache_dtype(load_dtype(model, profile, gpu)))


def cache_layout(model: str, profile: Profile, gpu: bool | GpuClass, target_tokens: int = 0) -> str:
    """The layout ``BaseOutputCache.build`` will choose for ``model``'s cache (``core.cache``):
    the profile's, or by ``choose_layout`` (compact on a GPU; on a CPU full where it fits memory)."""
    in_process = models.model_spec(model)["source"] != "api"
    if profile.cache_layout != "auto" and in_process:
        return profile.cache_layout
    return choose_layout(_full_cache_bytes(model, target_tokens, profile, gpu), device_type="cuda" if gpu else "cpu",
                         compact=in_process, host_available=host_available_bytes())[0]


def cache_bytes(model: str, target_tokens: int, profile: Profile, gpu: bool | GpuClass) -> int:
    """Bytes of ``model``'s cache of ``target_tokens`` in the layout it will have: V
    log-probabilities a token (full), or d hidden values in the model's dtype (compact)."""
    if cache_layout(model, profile, gpu, target_tokens) == "compact":
        return target_tokens * base_shape(model)["hidden"] * dtype_bytes(load_dtype(model, profile, gpu))
    return _full_cache_bytes(model, target_tokens, profile, gpu)


def inference_peak(model: str, profile: Profile, gpu: bool, copies: int = 1) -> int:
    """Bytes on the GPU while a base builds its cache, decodes, or a reweighting model trains
    beside it: weights, the largest transient (logits of a cache batch in float32, or the KV
    cache of a decoding batch), a reweighting model with AdamW, and 1 GiB of CUDA context."""
    s, b = base_shape(model), dtype_bytes(load_dtype(model, profile, gpu))
    seq = profile.tokens.max_prompt + profile.tokens.max_target + 1
    cache_batch = profile.training.batch_size * seq * s["vocab"] * (b + 4)
    decode_seq = profile.tokens.max_prompt + profile.decoding.max_new_tokens
    kv = 2 * s["layers"] * s["kv_width"] * profile.decoding.batch_size * decode_seq * b
    decode = kv + profile.decoding.batch_size * s["vocab"] * 4 * 3
    reweighter = 16 * reweighter_params(model)
    return copies * s["params"] * b + max(cache_batch, decode) + reweighter + GIB


def cache_training_peak(model: str, profile: Profile, gpu: bool | GpuClass, target_tokens: int,
                        reweighter: int | None = None) -> int:
    """Bytes on the GPU of a process that trains a reweighting model (``reweighter``
    parameters, the family's by default) from the stored cache with the base's output layer
    alone (``core.blackbox.OutputLayerBox``): the layer, the cache's rows held on the GPU, the
    model with AdamW (16 bytes a parameter), a batch's float32 log-probabilities of the base
    and the model at the target tokens with their gradients (4 copies), and 1 GiB of CUDA
    context. An estimate: a rates file's measured peak replaces it (``harness.planning.concurrency``)."""
    s, b = base_shape(model), dtype_bytes(load_dtype(model, profile, gpu))
    targets = profile.training.batch_size * (profile.tokens.max_target + 1)
    params = reweighter_params(model) if reweighter is None else reweighter
    return (s["vocab"] * s["hidden"] * b + cache_bytes(model, target_tokens, profile, gpu) + 16 * params
            + targets * s["vocab"] * 4 * 4 + GIB)


def training_peak(model: str, profile: Profile, gpu: bool | GpuClass, *, full: bool, trainable_share: float = 1.0,
                  adapters: int = 0, recompute: bool = True) -> int:
    """Bytes on the GPU for training through the base: full fine-tuning in float32 (weights,
    gradients, AdamW's two moments: 16 bytes per trained parameter) or LoRA on the loaded base
    (``adapters`` float32 parameters with their gradients and moments: 16 bytes each); plus
    activations kept for the backward pass (about 10 hidden-size and 3 intermediate-size
    tensors per layer and token; LoRA with ``recompute`` recomputes them,
    ``lora.checkpoint_activations``, keeping each block's input and one block's activations) and
    the float32 logits, their log-softmax and its gradient."""
    s = base_shape(model)
    b = 4 if full else dtype_bytes(load_dtype(model, profile, gpu))
    tokens = profile.training.batch_size * (profile.tokens.max_prompt + profile.tokens.max_target + 1)
    block = tokens * (10 * s["hidden"] + 3 * s["intermediate"]) * b
    activations = block * s["layers"] if full or not recompute else tokens * s["layers"] * s["hidden"] * b + block
    logits = tokens * s["vocab"] * 4 * 3
    weights = s["params"] * (4 + 12 * trainable_share) if full else s["params"] * b + 16 * adapters
    return int(weights + activations + logits + GIB)


def lora_recompute(model: str, profile: Profile, gpu_bytes: int) -> bool:
    """Whether LoRA through ``model`` recomputes its activations (``lora.checkpoint_activations``):
    where the planned peak without (the black box, its trained copy with every block's
    activations) exceeds ``gpu_bytes`` less the GPU's headroom. The gradients are the same either
    way (tests/test_lora.py); recomputing costs about a third more compute."""
    peak = inference_peak(model, profile, True) + training_peak(model, profile, True, full=False, recompute=False)
    return peak > gpu_bytes - gpu_headroom(gpu_bytes)


def lora_adapter_params(model: str, rank: int) -> int:
    """Parameters of rank-``rank`` adapters on every linear layer of ``model``'s blocks
    (``finetune.LORA_LAYERS``): r * (fan in + fan out) per layer."""
    s = base_shape(model)
    kv, h, i = s["kv_width"], s["hidden"], s["intermediate"]
    if models.model_config(shape_model(model)).model_type == "gpt2":
        per_block = (h + 3 * h) + (h + h) + (h + i) + (i + h)  # c_attn, attention c_proj, c_fc, MLP c_proj
    else:
        per_block = 2 * (h + h) + 2 * (h + kv) + 3 * (h + i)  # q, o; k, v; gate, up, down
    return rank * per_block * s["layers"]


def finetune_setup(model: str, profile: Profile):
    """The fine-tuning recipe (a profile ``Finetune``) the profile applies to ``model``: notebook
    10's for its base (``shift.finetune``), the ablations' otherwise."""
    if profile.shift.finetune is not None and model == (profile.shift.model or profile.ablations.model):
        return profile.shift.finetune
    return profile.ablations.finetune


def trainable_share(model: str, trainable_layers: int | None) -> float:
    if trainable_layers is None:
        return 1.0
    return min(1.0, trainable_layers / base_shape(model)["layers"])
