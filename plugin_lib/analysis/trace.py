"""Token probabilities of style words along a Plugin decode: the bottom row of Figure 4.

Each word is scored by the probability of its *first* token as it would appear mid-sentence,
that is the first token of ``" " + word``. For a word the tokenizer splits into several
tokens this is an upper bound on the word's probability (the mass of every continuation of
that first piece); ``n_tokens`` in the trace says when it applies. Capitalised forms
("Keep" at a sentence start) are other tokens and are not added in.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from ..core.blackbox import BlackBoxLM
from ..core.combine import combine_log_probs
from ..core.decode import greedy_decode_uncached, repetition_penalty_processor
from ..core.reweighter import reweighter_logits

TRACE_COLUMNS = ["step", "chosen", "word", "token", "token_id", "n_tokens", "base", "plugin"]


def _significant(probability: float, digits: int = 4) -> float:
    """Four significant digits: the trace is recomputed at every execution, and the last digits
    of a float32 forward pass move with the number of threads."""
    return float(f"{probability:.{digits}g}")


def word_first_token(tokenizer, word: str) -> tuple[int, int]:
    """(id of the first token of ``" " + word``, number of tokens of ``" " + word``).

    Byte-level BPE tokenizers (GPT-2, LLaMA-3, SmolLM2) fold the space into the word's first
    token. SentencePiece tokenizers may emit the space as a token of its own; it is skipped.
    """
    ids = tokenizer.encode(" " + word, add_special_tokens=False)
    if len(ids) > 1 and not tokenizer.decode(ids[:1]).strip():
        ids = ids[1:]
    if not ids:
        raise ValueError(f"{word!r} has no tokens.")
    return ids[0], len(ids)


@torch.no_grad()
def _step_log_probs(base: BlackBoxLM, reweighter: torch.nn.Module, ids: torch.Tensor,
                    prompt_length: int, repetition_penalty: float | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, Plugin) log-probabilities (steps, vocab) of each generated position of ``ids``.

    One uncached forward pass of each model over the whole sequence; the repetition penalty,
    as in decoding, is applied to both models' logits with the prefix seen at that step.
    """
    mask = torch.ones_like(ids)
    window = slice(prompt_length - 1, ids.shape[1] - 1)  # positions that predict new tokens
    base_scores = base.logits(ids, mask)[0, window].float()
    device = next(reweighter.parameters()).device
    r_scores = reweighter_logits(reweighter.eval(), ids.to(device), mask.to(device))[0, window]
    r_scores = r_scores.float().to(base_scores.device)
    penalty = repetition_penalty_processor(repetition_penalty, prompt_length)
    if penalty is not None:
        for step in range(base_scores.shape[0]):
            prefix = ids[:, : prompt_length + step].to(base_scores.device)
            base_scores[step] = penalty(prefix, base_scores[step : step + 1].clone())[0]
            r_scores[step] = penalty(prefix, r_scores[step : step + 1].clone())[0]
    return F.log_softmax(base_scores, dim=-1), combine_log_probs(base_scores, r_scores)


def trace_token_probabilities(
    base: BlackBoxLM,
    reweighter: torch.nn.Module,
    prompt: str,
    words: Sequence[str],
    max_new_tokens: int = 64,
    repetition_penalty: float | None = None,
) -> tuple[str, str, pd.DataFrame]:
    """(base greedy text, Plugin greedy text, trace) for one prompt.

    The trace follows the Plugin's greedy decode: one row per step and word, with columns
    ``step`` (1 = first generated token), ``chosen`` (the token the Plugin emitted there),
    ``word``, ``token``, ``token_id``, ``n_tokens`` (see the module doc), ``base`` (the base
    model's probability of the word's first token given the Plugin's prefix) and ``plugin``
    (the combined probability, proportional to base x reweighter). With a repetition penalty
    both are taken after the penalty, i.e. the distributions decoding chose from. The prompt
    is used as given (tokenised with special tokens, as ``decode.generate`` does).

    Both greedy decodes re-run the models over the whole sequence at every step
    (``decode.greedy_decode_uncached``): exact and simple, but quadratic in length, so this
    is meant for one example, not a test set.
    """
    tokenizer = base.tokenizer
    enc = tokenizer(prompt, return_tensors="pt")
    prompt_length = enc.input_ids.shape[1]
    decode = dict(max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty)
    base_ids = greedy_decode_uncached(base, enc.input_ids, enc.attention_mask, None, **decode)
    plugin_ids = greedy_decode_uncached(base, enc.input_ids, enc.attention_mask, reweighter,
                                        **decode)
    base_log_p, plugin_log_p = _step_log_probs(base, reweighter, plugin_ids, prompt_length,
                                               repetition_penalty)
    generated = plugin_ids[0, prompt_length:].tolist()
    targets = [(word, *word_first_token(tokenizer, word)) for word in words]
    rows = [
        {"step": step + 1, "chosen": tokenizer.decode([chosen]), "word": word,
         "token": tokenizer.decode([token_id]), "token_id": token_id, "n_tokens": n_tokens,
         "base": _significant(base_log_p[step, token_id].exp().item()),
         "plugin": _significant(plugin_log_p[step, token_id].exp().item())}
        for step, chosen in enumerate(generated)
        for word, token_id, n_tokens in targets
    ]
    base_text = _text(tokenizer, base_ids, prompt_length)
    plugin_text = _text(tokenizer, plugin_ids, prompt_length)
    return base_text, plugin_text, pd.DataFrame(rows, columns=TRACE_COLUMNS)


def _text(tokenizer, ids: torch.Tensor, prompt_length: int) -> str:
    """The generated part of ``ids`` as text, as ``decode.generate`` returns it."""
    return tokenizer.decode(ids[0, prompt_length:], skip_special_tokens=True).strip()
