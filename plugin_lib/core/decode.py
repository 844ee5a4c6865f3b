"""Decoding over the combined distribution p_t = b_t * r_t / sum(b_t * r_t).

``PluginLogitsProcessor`` plugs a reweighting model into transformers' ``generate``: the base
model keeps its own KV cache inside ``generate``, and the processor runs the reweighting model
one token at a time with a KV cache of its own, so greedy search, sampling, top-p and beam
search all work over p_t. ``generate`` is the batched helper the experiments use.
``greedy_decode_uncached`` is the straightforward loop that re-runs both models over the whole
sequence at every step (the authors' approach); it is the reference the tests and the
benchmark compare against.

With ``static_cache``, both models decode from KV caches of a fixed size, so every step has the
same shapes: on a GPU, transformers compiles the base's step and this module the reweighting
model's, and CUDA graphs replay them without a kernel launch each (docs/gpu.md). The tokens are
today's path's (tests/test_decode_static.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm
from transformers import (LogitsProcessor, LogitsProcessorList, PreTrainedModel, RepetitionPenaltyLogitsProcessor,
                          StaticCache)

from .blackbox import BlackBoxLM
from .combine import combine_log_probs
from .reweighter import check_vocabulary, position_ids_from_mask, reweighter_logits

Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Prompts decoded with a static cache are left-padded to a multiple of this many tokens, so a
# run's batches share a few cache sizes (each size is one compiled step, one set of graphs).
STATIC_PAD = 32


def has_static_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` can decode from transformers' ``StaticCache`` and be compiled whole
    (a context-free model or an expert pair keeps its own cache)."""
    return isinstance(model, PreTrainedModel) and bool(getattr(model, "_can_compile_fullgraph", False))


def compiled_step(model: torch.nn.Module) -> Callable:
    """``model``'s forward compiled for one token at a time with fixed shapes; on a GPU,
    ``reduce-overhead`` replays it as CUDA graphs."""
    return torch.compile(model, mode="reduce-overhead", dynamic=False, fullgraph=False)


def repetition_penalty_processor(
    repetition_penalty: float | None, prompt_length: int
) -> RepetitionPenaltyLogitsProcessor | None:
    """CTRL-style penalty on the generated tokens only (the prompt is not penalised)."""
    if repetition_penalty is None or repetition_penalty == 1.0:
        return None
    return RepetitionPenaltyLogitsProcessor(float(repetition_penalty), prompt_ignore_length=prompt_length)


class PluginLogitsProcessor(LogitsProcessor):
    """Turns the base model's scores into the Plugin's log p_t inside ``model.generate``.

    Args:
        reweighter: the trained reweighting model (same vocabulary as the base).
        prompt_attention_mask: the attention mask of the (left-padded) prompts given to
            ``generate``; it tells the reweighting model which positions are padding.
        combine: how base and reweighting logits become log-probabilities (default: the
            Plugin's product; WeightedComb passes its mixture).
        repetition_penalty: applied to each model's logits before they are combined.
        static_length: decode the reweighting model from a ``StaticCache`` of this many
            positions (prompt and new tokens), where it has one (``has_static_cache``).
        step: what runs the one-token steps of the static path, e.g. ``compiled_step(model)``
            (default: the model itself).

    One processor serves one ``generate`` call; ``reset()`` makes it reusable.
    """

    def __init__(
        self,
        reweighter: torch.nn.Module,
        prompt_attention_mask: torch.Tensor,
        *,
        combine: Combine = combine_log_probs,
        repetition_penalty: float | None = None,
        static_length: int | None = None,
        step: Callable | None = None,
    ):
        self.reweighter = reweighter.eval()
        self.prompt_attention_mask = prompt_attention_mask
        self.combine = combine
        self.repetition_penalty = repetition_penalty
        self.static_length = static_length if static_length and has_static_cache(reweighter) else None
        self.step = step if step is not None else self.reweighter
        self.reset()

    def reset(self) -> None:
        self._cache = None
        self._seen: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._penalty = None
        self._static_mask: torch.Tensor | None = None

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._seen is None:  # the first step: before the reweighting model meets these ids
            check_vocabulary(scores.shape[-1], self.reweighter)
        r = self._reweighter_step(input_ids).to(scores.device)
        if self._penalty is not None:
            scores, r = self._penalty(input_ids, scores), self._penalty(input_ids, r)
        return self.combine(scores, r)

    def _reweighter_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        device = next(self.reweighter.parameters()).device
        if self._seen is None:
            new_ids, mask = input_ids, self._first_mask(input_ids).to(device)
            self._penalty = repetition_penalty_processor(self.repetition_penalty, input_ids.shape[1])
        else:
            if input_ids.shape[1] != self._seen.shape[1] + 1:
                raise RuntimeError(
                    "PluginLogitsProcessor already served another generate call: call reset() "
                    "or create a new processor for each call."
                )
            mask = self._follow_reordered_rows(input_ids[:, :-1])
            mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
            new_ids = input_ids[:, -1:]
        self._seen, self._mask = input_ids, mask
        new_ids = new_ids.to(device)
        if getattr(self.reweighter, "is_context_free", False):
            return self.reweighter(new_ids[:, -1:]).logits[:, -1]
        if self.static_length is not None:
            return self._static_step(new_ids, mask)
        out = self.reweighter(
            input_ids=new_ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask)[:, -new_ids.shape[1]:],
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._cache = out.past_key_values
        return out.logits[:, -1]

    def _static_step(self, new_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The step from a static cache: the attention mask is kept at the cache's full length
        (positions not reached yet are masked anyway), so every one-token step has one shape."""
        length = mask.shape[1]
        if length > self.static_length:
            raise RuntimeError(f"generate went past the static cache's {self.static_length} positions: give the "
                               "processor static_length = prompt length + max_new_tokens.")
        if self._static_mask is None:
            self._cache = StaticCache(config=self.reweighter.config, max_cache_len=self.static_length)
            self._static_mask = mask.new_zeros(mask.shape[0], self.static_length)
        self._static_mask[:, :length] = mask  # also after beam search reorders the rows
        forward = self.step if new_ids.shape[1] == 1 else self.reweighter  # the prompt: once, uncompiled
        out = forward(
            input_ids=new_ids,
            attention_mask=self._static_mask,
            position_ids=position_ids_from_mask(mask)[:, -new_ids.shape[1]:],
            past_key_values=self._cache,
            cache_position=torch.arange(length - new_ids.shape[1], length, device=mask.device),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].clone()  # a CUDA graph's output is overwritten by its next replay

    def _first_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = self.prompt_attention_mask
        if mask.shape[0] != input_ids.shape[0]:  # beams or num_return_sequences repeat each prompt
            mask = mask.repeat_interleave(input_ids.shape[0] // mask.shape[0], dim=0)
        if mask.shape != input_ids.shape:
            raise ValueError(
                f"prompt_attention_mask has shape {tuple(self.prompt_attention_mask.shape)} but "
                f"generate started from input_ids of shape {tuple(input_ids.shape)}: pass the "
                "attention mask of the same prompts."
            )
        return mask

    def _follow_reordered_rows(self, prefix: torch.Tensor) -> torch.Tensor:
        """Beam search reorders rows between steps: reorder the cache and mask to match."""
        if torch.equal(prefix, self._seen):
            return self._mask
        same = (prefix[:, None, :] == self._seen[None, :, :]).all(-1)
        if not same.any(1).all():
            raise RuntimeError("generate produced a row whose prefix this processor never saw; call reset().")
        parent = same.int().argmax(1).to(self._mask.device)
        if self._cache is not None:
            self._cache.reorder_cache(parent)
        return self._mask[parent]


def generate(
    base: BlackBoxLM,
    prompts: Sequence[str],
    reweighter: torch.nn.Module | None = None,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    repetition_penalty: float | None = None,
    max_prompt_tokens: int | None = None,
    combine: Combine = combine_log_probs,
    progress: bool = True,
    static_cache: bool = False,
    **generate_kwargs,
) -> list[str]:
    """Texts generated for ``prompts`` by the base alone or with a reweighting model.

    Prompts are batched with left padding, longest first (similar lengths share a batch);
    outputs come back in the order of ``prompts``. Greedy unless ``generate_kwargs`` say
    otherwise (``do_sample=True, top_p=0.9``, ``num_beams=4``, ...). ``static_cache``: both
    models decode from caches of a fixed size, prompts padded to a multiple of ``STATIC_PAD``;
    on a GPU their steps are compiled and run as CUDA graphs (the module docstring).
    """
    if reweighter is not None:
        check_vocabulary(base.vocab_size, reweighter)
    tokenizer = base.tokenizer
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    texts: list[str] = [""] * len(prompts)
    generate_kwargs.setdefault("do_sample", False)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    step = None
    if static_cache:
        generate_kwargs.setdefault("cache_implementation", "static")  # transformers compiles it on a GPU
        if reweighter is not None and base.device.type == "cuda" and has_static_cache(reweighter):
            step = compiled_step(reweighter.eval())
    for batch in tqdm(batches, desc="generate", disable=not progress or len(batches) < 2):
        enc = tokenizer(
            [prompts[i] for i in batch],
            return_tensors="pt",
            padding=True,
            truncation=max_prompt_tokens is not None,
            max_length=max_prompt_tokens,
            pad_to_multiple_of=STATIC_PAD if static_cache else None,
        )
        prompt_length = enc.input_ids.shape[1]
        if reweighter is None:
            processors = [p for p in [repetition_penalty_processor(repetition_penalty, prompt_length)] if p is not None]
        else:
            processors = [
                PluginLogitsProcessor(
                    reweighter, enc.attention_mask, combine=combine, repetition_penalty=repetition_penalty,
                    static_length=prompt_length + max_new_tokens if static_cache else None, step=step,
                )
            ]
        out = base.generate(
            enc.input_ids,
            enc.attention_mask,
            logits_processor=LogitsProcessorList(processors),
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=base.eos_token_id,
            **generate_kwargs,
        )
        decoded = tokenizer.batch_decode(out[:, prompt_length:], skip_special_tokens=True)
        for i, text in zip(batch, decoded):
            texts[i] = text.strip()
    return texts


@torch.no_grad()
def greedy_decode_uncached(
    base: BlackBoxLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reweighter: torch.nn.Module | None = None,
    *,
    max_new_tokens: int = 64,
    min_new_tokens: int = 0,
    repetition_penalty: float | None = None,
    combine: Combine = combine_log_probs,
) -> torch.Tensor:
    """Greedy decoding that re-runs both models over the full sequence at every step.

    Returns prompt + generated ids, padded after EOS with the pad token, as ``generate`` does.
    EOS is not allowed before ``min_new_tokens`` (as ``generate(min_new_tokens=...)``).
    """
    if reweighter is not None:
        check_vocabulary(base.vocab_size, reweighter)
    eos, pad = base.eos_token_id, base.tokenizer.pad_token_id
    penalty = repetition_penalty_processor(repetition_penalty, input_ids.shape[1])
    ids, mask = input_ids.to(base.device), attention_mask.to(base.device)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for step in range(max_new_tokens):
        scores = base.logits(ids, mask)[:, -1].float()
        if reweighter is not None:
            r = reweighter_logits(reweighter.eval(), ids, mask)[:, -1].to(scores.device)
            if penalty is not None:
                scores, r = penalty(ids, scores), penalty(ids, r)
            scores = combine(scores, r)
        elif penalty is not None:
            scores = penalty(ids, scores)
        if step < min_new_tokens:
            scores[:, eos] = float("-inf")
        next_ids = scores.argmax(-1).masked_fill(done, pad)
        ids = torch.cat((ids, next_ids[:, None]), dim=1)
        mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
        done |= next_ids == eos
        if done.all():
            break
    return ids
