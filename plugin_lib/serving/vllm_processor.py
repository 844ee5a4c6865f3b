"""The Plugin inside vLLM: a V1 batch-level logits processor, p_t ∝ b_t · r_t.

vLLM computes the base's logits b for every request of its persistent batch; this processor
holds the trained reweighting model and adds its log-probabilities, as ``core.combine.
combine_log_probs`` does: log p = log_softmax(log_softmax(b) + log_softmax(r)). Sampling
(temperature, top-p, seeds, stop strings) stays vLLM's, so greedy decoding is argmax p.

The reweighting model keeps one KV cache for the whole batch (:class:`BatchCache`): its rows
follow vLLM's requests through ``update_state`` (added, removed, moved), and each step feeds every
request only the tokens it has not seen (its prompt the first time, then its newest token), all
requests in one call. A row's cache is left-padded to the batch's length; columns no row needs
any more are dropped.

Per request, ``SamplingParams.extra_args`` (the OpenAI server's ``vllm_xargs``):

- ``plugin``: 0, "0", "off" or "false" serves the base alone from the same engine (default on);
- ``plugin_repetition_penalty``: the package's CTRL penalty on the generated tokens, applied to
  b and to r before they are combined, as ``core.decode`` does (vLLM's own ``repetition_penalty``
  acts after this processor, on prompt and output tokens: another rule).

The artifact comes from ``additional_config={"plugin_artifact": DIR}`` or the environment
variable ``PLUGIN_VLLM_ARTIFACT``. Load it with ``--logits-processors
plugin_lib.serving.vllm_processor:PluginLogitsProcessor`` (``plugin-repro serve --engine vllm``
does it). It imports torch, transformers and this package's core only: it runs in vLLM's own
environment (``scripts/bootstrap_vllm.sh``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, DynamicCache
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..core.reweighter import output_vocab_size
from .artifact_files import ArtifactError, load_reweighter, read_config

ARTIFACT_ENV = "PLUGIN_VLLM_ARTIFACT"
CONFIG_KEY = "plugin_artifact"
OFF = {"0", "off", "false", "no"}


def artifact_dir(vllm_config) -> Path:
    """The artifact the engine serves: ``additional_config["plugin_artifact"]``, else the environment."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    found = extra.get(CONFIG_KEY) or os.environ.get(ARTIFACT_ENV)
    if not found:
        raise ArtifactError(f"The Plugin's logits processor needs its artifact: set {ARTIFACT_ENV}=DIR, or pass "
                            f"additional_config={{'{CONFIG_KEY}': DIR}} (plugin-repro serve --engine vllm does it).")
    return Path(found)


def plugin_on(params: SamplingParams) -> bool:
    value = (params.extra_args or {}).get("plugin", True)
    return str(value).strip().lower() not in OFF


def penalty_of(params: SamplingParams) -> float | None:
    value = (params.extra_args or {}).get("plugin_repetition_penalty")
    return None if value in (None, "", 1, 1.0, "1") else float(value)


def penalise(scores: torch.Tensor, tokens: list[int], penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty on one row (``RepetitionPenaltyLogitsProcessor``'s rule): a
    negative score of a seen token times ``penalty``, a positive one divided by it."""
    if not tokens:
        return scores
    index = torch.tensor(sorted(set(tokens)), device=scores.device)
    seen = scores.index_select(-1, index)
    return scores.index_copy(-1, index, torch.where(seen < 0, seen * penalty, seen / penalty))


@dataclass
class Request:
    """One request of the batch, as the processor follows it."""

    prompt: list[int]
    output: list[int]  # vLLM's own list: it grows as tokens are sampled
    plugin: bool
    penalty: float | None
    fed: int = 0  # tokens the reweighting model has seen
    last: torch.Tensor | None = None  # r's logits after them (a step with no new token reuses them)
    key: object = field(default_factory=object)  # its identity in the cache

    def unfed(self) -> list[int]:
        return (self.prompt + self.output)[self.fed:]


class BatchCache:
    """The reweighting model's KV cache for several requests at once: row i belongs to
    ``keys[i]``; every row is right-aligned (left-padded) to the cache's length, with a mask."""

    def __init__(self):
        self.keys: list[object] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, length), 1 where a row has a token

    def _layers(self):
        return self.cache.layers if self.cache is not None else []

    def keep(self, keys: list[object]) -> None:
        """Keep the rows of ``keys`` (in that order), drop the others."""
        if keys == self.keys:
            return
        if not keys or self.cache is None:
            self.keys, self.cache, self.mask = [], None, None
            return
        index = torch.tensor([self.keys.index(k) for k in keys], device=self.mask.device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self.mask, self.keys = self.mask.index_select(0, index), list(keys)

    def add(self, keys: list[object]) -> None:
        """New rows at the end, empty (masked) over the cache's length."""
        if not keys:
            return
        self.keys += keys
        if self.cache is None:
            return
        for layer in self._layers():
            for name in ("keys", "values"):
                old = getattr(layer, name)
                setattr(layer, name, torch.cat((old, old.new_zeros((len(keys), *old.shape[1:])))))
        self.mask = torch.cat((self.mask, self.mask.new_zeros(len(keys), self.mask.shape[1])))

    def extend(self, block_mask: torch.Tensor) -> torch.Tensor:
        """The attention mask over the cache and a new block of columns; the cache's new mask."""
        self.mask = block_mask if self.mask is None else torch.cat((self.mask, block_mask), dim=1)
        return self.mask

    def trim(self) -> None:
        """Drop the leading columns that no row has a token in."""
        if self.mask is None:
            return
        used = self.mask.any(0).nonzero()
        start = int(used[0]) if len(used) else self.mask.shape[1]
        if start:
            for layer in self._layers():
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self.mask = self.mask[:, start:]


class PluginLogitsProcessor(LogitsProcessor):
    """vLLM V1's batch-level logits processor for a trained Plugin (module docstring)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        directory = artifact_dir(vllm_config)
        config = read_config(directory)
        self.reweighter = load_reweighter(directory, config["reweighter"]).to(device)
        self.device = device
        served = vllm_config.model_config.tokenizer
        saved, theirs = AutoTokenizer.from_pretrained(directory / "tokenizer"), AutoTokenizer.from_pretrained(served)
        if saved.get_vocab() != theirs.get_vocab():
            raise ArtifactError(f"The Plugin {directory} was trained on another tokenizer than the served model's "
                                f"({served}; {len(saved)} vs {len(theirs)} tokens): serve the base it was trained for.")
        self.vocab_size = output_vocab_size(self.reweighter)
        self.context_free = bool(getattr(self.reweighter, "is_context_free", False))
        self.requests: dict[int, Request] = {}  # by vLLM's batch index
        self.cache = BatchCache()

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        penalty = (sampling_params.extra_args or {}).get("plugin_repetition_penalty")
        if penalty not in (None, ""):
            try:
                ok = float(penalty) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"plugin_repetition_penalty must be a positive number, got {penalty!r}.")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is most likely: greedy requests must pass through it

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.requests.pop(index, None)
        for index, params, prompt, output in batch_update.added:  # may replace a request at that index
            self.requests[index] = Request(list(prompt or []), output, plugin_on(params), penalty_of(params))
        for a, b, direction in batch_update.moved:
            first, second = self.requests.pop(a, None), self.requests.pop(b, None)
            if first is not None:
                self.requests[b] = first
            if second is not None and direction == MoveDirectionality.SWAP:
                self.requests[a] = second

    @torch.no_grad()
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] != self.vocab_size:
            raise ArtifactError(f"Vocabulary mismatch: the served model scores {logits.shape[-1]} tokens, the "
                                f"reweighting model {self.vocab_size}: serve the base the Plugin was trained for.")
        rows = sorted(i for i in self.requests if i < logits.shape[0])
        plugged = [i for i in rows if self.requests[i].plugin]
        for i in rows:
            request = self.requests[i]
            if request.penalty is not None:
                logits[i] = penalise(logits[i], request.output, request.penalty)
        if not plugged:
            self.cache.keep([])
            return logits
        r = self._reweighter_logits([self.requests[i] for i in plugged])
        index = torch.tensor(plugged, device=logits.device)
        for k, i in enumerate(plugged):
            request = self.requests[i]
            if request.penalty is not None:
                r[k] = penalise(r[k], request.output, request.penalty)
        combined = F.log_softmax(F.log_softmax(logits.index_select(0, index).float(), -1)
                                 + F.log_softmax(r.to(logits.device).float(), -1), -1)
        return logits.index_copy(0, index, combined.to(logits.dtype))

    def _reweighter_logits(self, requests: list[Request]) -> torch.Tensor:
        """r's logits at each request's newest position: one call, each request fed what it has not seen."""
        if self.context_free:  # it reads the newest token alone
            last = torch.tensor([(r.prompt + r.output)[-1] for r in requests], device=self.device)
            return self.reweighter(last[:, None]).logits[:, -1]
        cache = self.cache
        keys = [r.key for r in requests]
        wanted, held = set(keys), set(cache.keys)
        cache.keep([k for k in cache.keys if k in wanted])
        cache.add([k for k in keys if k not in held])
        by_key = {r.key: r for r in requests}
        ordered = [by_key[k] for k in cache.keys]
        new = [r.unfed() for r in ordered]
        width = max(1, max(len(ids) for ids in new))
        ids = torch.zeros(len(ordered), width, dtype=torch.long)
        block = torch.zeros(len(ordered), width, dtype=torch.long)
        positions = torch.zeros(len(ordered), width, dtype=torch.long)
        for k, (request, tokens) in enumerate(zip(ordered, new)):
            if tokens:  # left-padded within the block: its last column is each row's newest token
                ids[k, width - len(tokens):] = torch.tensor(tokens)
                block[k, width - len(tokens):] = 1
                positions[k, width - len(tokens):] = torch.arange(request.fed, request.fed + len(tokens))
        mask = cache.extend(block.to(self.device))
        if cache.cache is None:
            cache.cache = DynamicCache()
        out = self.reweighter(input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions.to(self.device),
                              past_key_values=cache.cache, use_cache=True, logits_to_keep=1)
        cache.cache = out.past_key_values
        for k, (request, tokens) in enumerate(zip(ordered, new)):
            if tokens:
                request.fed, request.last = request.fed + len(tokens), out.logits[k, -1]
        cache.trim()
        return torch.stack([by_key[k].last for k in keys])
