"""The black box: a frozen causal LM seen from outside, and its top-k log-probability view.

``BlackBoxLM`` exposes only what a closed model with logit access would: next-token logits for
given token ids, and generation with a logits-processor hook; never weights or gradients.

The paper assumes the closed model exposes its whole next-token distribution b_t. Real APIs
return the log-probabilities of the k most likely tokens only (often k = 5 or 20).
``TopKBlackBox`` wraps a ``BlackBoxLM`` so that everything downstream (the base-output cache,
Zeroshot, the Plugin's logits processor, beam search) sees exactly that, with the tokens
outside the top k filled in by one of two rules:

- ``"residual"`` (the default): the top-k log-probabilities are kept exactly as the API gives
  them, and the missing mass 1 - sum(top-k probabilities) is spread uniformly over the other
  V - k tokens. This is the least committal completion of what the API reports: it adds no
  information about the unreported tokens beyond their total mass, and never reorders tokens
  (each unreported token gets at most the k-th probability, since their average cannot exceed
  it). The reweighting model can still promote an unreported token, and every training target
  keeps a finite loss.
- ``"renormalize"``: -inf outside the top k, the top k renormalised to sum to 1. Then no token
  outside the top k can ever be produced, by Zeroshot or by the Plugin (b_t * r_t = 0 for
  every r_t), and a training target outside the top k has infinite loss. Training on this
  view leaves such targets out (``core.train.reachable_plugin_log_probs``): they are tokens the
  decoding model cannot produce, so the model is fitted on the ones it can.

The default is ``residual`` because it uses the reported numbers unchanged and keeps the Plugin
what the paper makes it, a reweighting of the base over the whole vocabulary.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .reweighter import position_ids_from_mask

RULES = ("residual", "renormalize")
DEFAULT_RULE = "residual"


class BlackBoxLM:
    """A frozen causal LM seen from outside: token ids in, next-token logits out.

    The wrapped model is private and frozen; every call runs without autograd, so nothing
    downstream can reach the weights or push gradients into them.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str = "base"):
        model.eval()
        model.requires_grad_(False)
        self._model = model
        self.tokenizer = tokenizer
        self.name = name

    @property
    def vocab_size(self) -> int:
        """Number of logits per position (may exceed len(tokenizer), e.g. padded vocabularies)."""
        return self._model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self._model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the logits it returns."""
        return self._model.dtype

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits (B, T, V) for every position of a (left-padded) batch."""
        input_ids = input_ids.to(self.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(self.device)
        out = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        return out.logits

    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next-token logits (N, V) at the positions where the boolean mask ``positions`` (B, T)
        is true, in row-major order (as ``logits(...)[positions]``).

        The base-output cache asks for the target positions only: a black box behind an API
        (``core.api.ApiBlackBox``) then requests just those.
        """
        logits = self.logits(input_ids, attention_mask)
        return logits[positions.to(logits.device)]

    # ---- the compact base-output cache (core.cache): for a model that runs in this process,
    # its final hidden states at the target positions are stored instead of its V log-probabilities,
    # and its own output layer turns them back into exactly those log-probabilities when read.
    # What leaves the cache is still only the next-token distribution (``OutputHead.log_probs``).

    @property
    def states_name(self) -> str:
        """The model whose hidden states this box's outputs come from (a view shares its base's)."""
        return self.name

    def view(self, logits: torch.Tensor) -> torch.Tensor:
        """What this box makes of the model's logits (the model's own: unchanged)."""
        return logits

    def output_head(self) -> OutputHead | None:
        """The model's output layer as an :class:`OutputHead`, or None where it is not one
        linear map (then only the full-vocabulary cache can hold this box's outputs)."""
        head = self._model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            return None
        return OutputHead(head.weight, head.bias, self.view)

    @torch.no_grad()
    def hidden_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The output layer's input (N, d), in the model's dtype, at the positions where the
        boolean mask ``positions`` is true (row-major, as ``logits_at``). ValueError where the
        model changes the output layer's result before returning it (a logit soft-cap, a scale):
        the hidden states would not give back its logits."""
        head = self._model.get_output_embeddings()
        seen: dict[str, torch.Tensor] = {}

        def keep(_module, inputs, output):
            seen["hidden"], seen["logits"] = inputs[0], output

        handle = head.register_forward_hook(keep)
        try:
            logits = BlackBoxLM.logits(self, input_ids, attention_mask)
        finally:
            handle.remove()
        if "hidden" not in seen or not torch.equal(seen["logits"].to(logits.dtype), logits):
            raise ValueError(f"{self.name}: the model's logits are not its output layer's output, so its hidden "
                             "states cannot stand for them; use the full-vocabulary cache (layout 'full').")
        return seen["hidden"][positions.to(logits.device)]

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values=None):
        """One decoding step with a KV cache: the next-token logits (B, V, float32, the box's
        view) after ``input_ids`` (the new tokens of a left-padded batch; ``attention_mask``
        covers the cache's positions and theirs), and the cache that continues it."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        out = self._model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids_from_mask(attention_mask)[:, -input_ids.shape[1]:],
                          past_key_values=past_key_values, use_cache=True, logits_to_keep=1)
        return self.view(out.logits[:, -1]).float(), out.past_key_values

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """transformers' ``generate`` (with its KV cache); ``logits_processor`` is the Plugin's hook."""
        return self._model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **kwargs
        )

    def __repr__(self) -> str:
        return f"BlackBoxLM({self.name!r}, vocab_size={self.vocab_size}, device={self.device})"


class OutputHead:
    """A base's output layer, ``logits = hidden @ weight.T + bias``, then the box's ``view``: maps
    stored final hidden states to the log-probabilities the box returns for them, in float32.

    Computed in the weight's dtype on the weight's device, as the model computes its logits, so
    the rows equal those of a full-vocabulary cache within that dtype's rounding."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, view=None):
        self.weight, self.bias, self._view = weight, bias, view or (lambda logits: logits)

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @torch.no_grad()
    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden.to(self.weight.device, self.weight.dtype), self.weight, self.bias)
        return F.log_softmax(self._view(logits).float(), dim=-1)

    def to(self, device: torch.device | str) -> "OutputHead":
        bias = None if self.bias is None else self.bias.to(device)
        return OutputHead(self.weight.to(device), bias, self._view)


def restrict_log_probs(scores: torch.Tensor, k: int | None, rule: str = DEFAULT_RULE) -> torch.Tensor:
    """What a top-k API returns for next-token ``scores`` (..., V): log-probabilities, in the
    dtype of ``scores``, with the tokens outside the top k filled in by ``rule``.

    For k = None or k >= V every log-probability is returned (an API without a top-k limit).
    """
    _check(k, rule)
    log_p = F.log_softmax(scores.float(), dim=-1)
    vocab = log_p.shape[-1]
    if k is None or k >= vocab:
        return log_p.to(scores.dtype)
    top, index = log_p.topk(k, dim=-1)
    top, fill = complete_top_k(top, vocab, rule)
    out = log_p.copy_(fill.expand_as(log_p))  # reuse the buffer: (B, T, V) is large
    return out.scatter_(-1, index, top).to(scores.dtype)


def complete_top_k(top: torch.Tensor, vocab: int, rule: str = DEFAULT_RULE) -> tuple[torch.Tensor, torch.Tensor]:
    """The reported log-probabilities ``top`` (..., m) of m distinct tokens as ``rule`` keeps
    them, and the log-probability (..., 1) of each of the other ``vocab - m`` tokens.

    ``residual``: ``top`` unchanged, the missing mass spread uniformly over the others;
    ``renormalize``: ``top`` renormalised, the others -inf. Shared by the in-process view
    and the HTTP black box (``core.api``), so both complete what an API reports alike.
    """
    kept = top.logsumexp(-1, keepdim=True)  # log of the reported mass
    m = top.shape[-1]
    if rule == "renormalize" or m >= vocab:
        return top - kept, torch.full_like(kept, -math.inf)
    # log((1 - exp(kept)) / (V - m)); -expm1 stays exact when the reported tokens hold almost
    # all the mass, and the clamp turns a rounding overshoot into an empty residual (-inf).
    return top, (-torch.expm1(kept)).clamp(min=0).log() - math.log(vocab - m)


def _check(k: int | None, rule: str) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"k must be a positive integer or None (all tokens), got {k!r}")
    if rule not in RULES:
        raise ValueError(f"Unknown top-k rule {rule!r}; choose one of {RULES}.")


class TopKBlackBox(BlackBoxLM):
    """``base`` as a top-k log-probability API: ``logits`` and ``generate`` expose per position
    the top-k log-probabilities and, elsewhere, what ``rule`` says (see the module docstring).
    """

    def __init__(self, base: BlackBoxLM, k: int | None, rule: str = DEFAULT_RULE, name: str | None = None):
        _check(k, rule)
        # The view runs the very same frozen model; only what leaves it changes.
        super().__init__(base._model, base.tokenizer, name or f"{base.name}@top{k or 'all'}-{rule}")
        self.k, self.rule, self._states_name = k, rule, base.states_name

    def restrict(self, scores: torch.Tensor) -> torch.Tensor:
        return restrict_log_probs(scores, self.k, self.rule)

    @property
    def states_name(self) -> str:
        return self._states_name

    def view(self, logits: torch.Tensor) -> torch.Tensor:
        return self.restrict(logits)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The API's log-probabilities (B, T, V) for every position (normalised: any
        log_softmax downstream leaves them unchanged)."""
        return self.restrict(super().logits(input_ids, attention_mask))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """transformers' ``generate`` on the API's view.

        The restriction is applied to the model's output, so it comes before every logits
        processor, warper and beam-search score. A processor put first in ``logits_processor``
        would not be: generate runs the processors it builds from its own arguments
        (``repetition_penalty=``, ``min_new_tokens=``, ...) before the ones it is given. The
        repetition penalty therefore acts on log-probabilities, as it must with a real API.
        """
        handle = self._model.register_forward_hook(self._restrict_output)
        try:
            return super().generate(input_ids, attention_mask, **kwargs)
        finally:
            handle.remove()

    def _restrict_output(self, _module, _inputs, output):
        output.logits = self.restrict(output.logits)
        return output

    def __repr__(self) -> str:
        return f"TopKBlackBox({self.name!r}, k={self.k}, rule={self.rule!r}, vocab_size={self.vocab_size})"


class OutputLayerBox:
    """A base known by its output layer alone: all that training a reweighting model from a
    stored base-output cache reads of the base (name, tokenizer, vocabulary, device, dtype and
    ``output_head``), without its body. A process that only trains from a cache holds this
    instead of the whole base (LLaMA-3.1-8B: its 1 GiB output layer, not 16 GiB), so several
    trainings share one GPU (``harness.grid.executors``). The head is the loaded model's own,
    bit for bit (``harness.running.output_layers``), so what it trains is what the whole
    base would train. It runs no model: asked for logits, it says to load the base."""

    def __init__(self, head: OutputHead, tokenizer: PreTrainedTokenizerBase, name: str,
                 states_name: str | None = None):
        self._head, self.tokenizer, self.name = head, tokenizer, name
        self._states_name = states_name or name

    @classmethod
    def top_k_view(cls, box: OutputLayerBox, k: int | None, rule: str = DEFAULT_RULE, name: str | None = None
                   ) -> OutputLayerBox:
        """``box`` as ``TopKBlackBox`` would show it: the same layer, the view's restriction after it."""
        _check(k, rule)
        head = OutputHead(box._head.weight, box._head.bias, lambda logits: restrict_log_probs(logits, k, rule))
        return cls(head, box.tokenizer, name or f"{box.name}@top{k or 'all'}-{rule}", box.states_name)

    @property
    def vocab_size(self) -> int:
        return self._head.vocab_size

    @property
    def device(self) -> torch.device:
        return self._head.device

    @property
    def dtype(self) -> torch.dtype:
        return self._head.weight.dtype

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def states_name(self) -> str:
        return self._states_name

    def output_head(self) -> OutputHead:
        return self._head

    def _no_body(self, *_args, **_kwargs):
        raise RuntimeError(f"{self.name} was loaded as its output layer only (to train from a stored base-output "
                           "cache): it cannot run the model. Load the whole base (harness.models.load_base_model) "
                           "to build a cache or to decode.")

    logits = logits_at = hidden_at = step = generate = _no_body

    def __repr__(self) -> str:
        return f"OutputLayerBox({self.name!r}, vocab_size={self.vocab_size}, device={self.device})"
