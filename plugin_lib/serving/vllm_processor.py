"""The Plugin inside vLLM: a V1 batch-level logits processor, p_t ∝ b_t · r_t.

vLLM computes the base's logits b for every request of its persistent batch; this processor
holds the trained reweighting model and adds its log-probabilities, as ``core.combine.
combine_log_probs`` does: log p = log_softmax(log_softmax(b) + log_softmax(r)). It returns
b + r (the two models' logits), which differs from log p by each row's constant: vLLM's own
softmax removes it (sampling, and the processed log-probabilities it returns), so the
distribution is the same with one pass over the vocabulary instead of three; in the usual step
(every row plugged, no penalty) r's output layer adds its product straight into b (``addmm_``). Sampling (temperature, top-p, seeds, stop
strings) stays vLLM's, so greedy decoding is argmax p, up to rounding at near-ties.

The reweighting model keeps one KV cache for the whole batch (``serving.batch_cache``): the
processor follows vLLM's requests through ``update_state`` (added, removed, moved), and each
step feeds every request only the tokens it has not seen (its prompt the first time, then its
newest token), all requests in one call.

Per request, ``SamplingParams.extra_args`` (the OpenAI server's ``vllm_xargs``):

- ``plugin``: 0, "0", "off" or "false" serves the base alone from the same engine (default on);
- ``plugin_repetition_penalty``: the package's CTRL penalty on the generated tokens, applied to
  b and to r before they are combined, as ``core.decode`` does; by default the artifact's own
  (``decoding.repetition_penalty``), for the base alone too, as ``generate --base-only`` decodes
  it; 1 turns it off. vLLM's own ``repetition_penalty`` acts after this processor, on prompt and
  output tokens: another rule, on top.

The artifact comes from ``additional_config={"plugin_artifact": DIR}`` or the environment
variable ``PLUGIN_VLLM_ARTIFACT``; ``PLUGIN_VLLM_HEAD_DTYPE=bfloat16`` computes the reweighting
model's output layer in bfloat16 (an approximation, opt-in). Load it with ``--logits-processors
plugin_lib.serving.vllm_processor:PluginLogitsProcessor`` (``plugin-repro serve --engine vllm``
does it). It imports torch, transformers and this package's core only: it runs in vLLM's own
environment (``scripts/bootstrap_vllm.sh``).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..core.reweighter import output_vocab_size
from .artifact_files import ArtifactError, load_reweighter, read_config
from .batch_cache import BatchCache, Request, step

ARTIFACT_ENV = "PLUGIN_VLLM_ARTIFACT"
# The reweighting model's output layer computes in float32 (exact) or bfloat16 (about 3 significant
# digits, opt-in: --head-dtype bfloat16, as the package's own engine offers it).
HEAD_DTYPE_ENV = "PLUGIN_VLLM_HEAD_DTYPE"
HEAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
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


def penalty_of(params: SamplingParams, default: float | None) -> float | None:
    """The request's ``plugin_repetition_penalty``, else the artifact's (None: no penalty)."""
    value = (params.extra_args or {}).get("plugin_repetition_penalty", default)
    return None if value in (None, "") or float(value) == 1.0 else float(value)


def penalise(scores: torch.Tensor, tokens: list[int], penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty on one row (``RepetitionPenaltyLogitsProcessor``'s rule): a
    negative score of a seen token times ``penalty``, a positive one divided by it."""
    if not tokens:
        return scores
    index = torch.tensor(sorted(set(tokens)), device=scores.device)
    seen = scores.index_select(-1, index)
    return scores.index_copy(-1, index, torch.where(seen < 0, seen * penalty, seen / penalty))


class PluginLogitsProcessor(LogitsProcessor):
    """vLLM V1's batch-level logits processor for a trained Plugin (module docstring)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        directory = artifact_dir(vllm_config)
        config = read_config(directory)
        self.reweighter = load_reweighter(directory, config["reweighter"]).to(device)
        self.device, self.penalty = device, (config.get("decoding") or {}).get("repetition_penalty")
        served = vllm_config.model_config.tokenizer
        saved, theirs = AutoTokenizer.from_pretrained(directory / "tokenizer"), AutoTokenizer.from_pretrained(served)
        if saved.get_vocab() != theirs.get_vocab():
            raise ArtifactError(f"The Plugin {directory} was trained on another tokenizer than the served model's "
                                f"({served}; {len(saved)} vs {len(theirs)} tokens): serve the base it was trained for.")
        self.vocab_size = output_vocab_size(self.reweighter)
        self.requests: dict[int, Request] = {}  # by vLLM's batch index
        head = os.environ.get(HEAD_DTYPE_ENV, "float32")
        if head not in HEAD_DTYPES:
            raise ArtifactError(f"{HEAD_DTYPE_ENV}={head!r}: choose one of {', '.join(HEAD_DTYPES)}.")
        self.cache = BatchCache(HEAD_DTYPES[head])

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
            self.requests[index] = Request(list(prompt or []), output, plugin_on(params),
                                           penalty_of(params, self.penalty))
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
        features = step(self.reweighter, self.cache, [self.requests[i] for i in plugged], self.device)
        # log b + log r up to each row's constant, which vLLM's softmax (sampling, processed
        # log-probabilities) removes: combine_log_probs' distribution from b + r, one pass over the vocabulary
        penalised = [k for k, i in enumerate(plugged) if self.requests[i].penalty is not None]
        head = self.cache.head
        if (len(plugged) == logits.shape[0] and not penalised and head is not None and head.dtype == logits.dtype
                and logits.is_contiguous()):  # the usual batch: r's output layer adds itself to b in one product
            return logits.addmm_(features.to(logits.device), head)
        r = self.cache.logits(features)
        for k in penalised:
            request = self.requests[plugged[k]]
            r[k] = penalise(r[k], request.output, request.penalty)
        r = r.to(logits.device, logits.dtype)
        if len(plugged) == logits.shape[0]:
            return logits.add_(r)
        return logits.index_add_(0, torch.tensor(plugged, device=logits.device), r)
