"""Continuous batching for a base in this process: requests join and leave at token boundaries.

One thread decodes every admitted request together. A request joins between two steps: its
prompt is run through both models alone (its own KV caches), and its caches are then left-padded
into the batch's. It leaves at the step it finishes (end of sequence, ``max_new_tokens``, or its
``cancel`` event: a disconnected client), and its rows are dropped from the caches. Each request
keeps its own sampling settings (greedy, or temperature and top-p with a generator seeded by
its own seed), its own repetition penalty over its own generated tokens, and its own streamer.

A step computes, per row, what ``PluginModel.complete`` computes through transformers'
``generate`` and ``PluginLogitsProcessor``: the base's logits (its view) and the reweighting
model's, each with the repetition penalty, combined into log p_t, then temperature and top-p.
Greedy outputs equal single-request decoding token for token (tests/test_batching.py).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicCache

from ..core.blackbox import BlackBoxLM
from ..core.combine import combine_log_probs
from ..core.reweighter import position_ids_from_mask


@dataclass
class Request:
    """One prompt to continue; ``done`` gets ``(token ids generated, finish_reason)``."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    streamer: object | None = None  # transformers' streamer protocol: put(ids), end()
    min_new_tokens: int = 0  # the end of sequence is ruled out before this many tokens
    cancel: threading.Event = field(default_factory=threading.Event)
    done: Future = field(default_factory=Future)
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def _pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat((tensor.new_zeros(shape), tensor), dim=dim)


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _joined(a: DynamicCache | None, b: DynamicCache, length: int) -> DynamicCache:
    """Two caches as one batch, each left-padded to ``length`` positions."""
    if a is None:
        return DynamicCache([(_pad_left(k, length, 2), _pad_left(v, length, 2)) for k, v in _layers(b)])
    return DynamicCache([(torch.cat((_pad_left(ka, length, 2), _pad_left(kb, length, 2))),
                          torch.cat((_pad_left(va, length, 2), _pad_left(vb, length, 2))))
                         for (ka, va), (kb, vb) in zip(_layers(a), _layers(b))])


class BatchEngine:
    """Decodes ``Request``s with ``base`` and ``reweighter`` in one batch on a thread of its own.
    ``max_batch``: rows decoded at once (later requests wait in its queue)."""

    def __init__(self, base: BlackBoxLM, reweighter: torch.nn.Module, *, eos_token_id: int,
                 repetition_penalty: float | None = None, max_batch: int = 8):
        self.base, self.reweighter, self.eos = base, reweighter.eval(), eos_token_id
        self.context_free = getattr(reweighter, "is_context_free", False)
        self.penalty = repetition_penalty if repetition_penalty not in (None, 1.0) else None
        self.max_batch = max_batch
        self.waiting: queue.Queue[Request | None] = queue.Queue()
        self.rows: list[Request] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.steps = 0  # decoding steps run (for tests and the benchmark)

    def submit(self, request: Request) -> Future:
        if request.temperature and request.seed is not None:
            request.generator = torch.Generator().manual_seed(request.seed)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="batch-engine", daemon=True)
                self._thread.start()
        self.waiting.put(request)
        return request.done

    def close(self) -> None:
        """Stop the thread once the requests it holds are finished."""
        self.waiting.put(None)

    # -- the loop

    @torch.no_grad()
    def _run(self) -> None:
        closing = False
        self._reset()
        while True:
            if not self.rows:
                if closing:
                    return
                item = self.waiting.get()
                if item is None:
                    return
                self._join(item)
            while not closing and len(self.rows) < self.max_batch:
                try:
                    item = self.waiting.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                self._join(item)
            if self.rows:
                try:
                    self._step()
                except BaseException as err:  # noqa: BLE001 - the batch fails, the engine goes on
                    for request in self.rows:
                        if not request.done.done():
                            request.done.set_exception(err)
                    self._reset()

    def _reset(self) -> None:
        self.rows, self.mask = [], None
        self.base_cache = self.rw_cache = None
        self.base_logits = self.rw_logits = None

    def _join(self, request: Request) -> None:
        if request.cancel.is_set() or request.done.cancelled():
            self._finish(request, "cancelled")
            return
        try:
            ids = torch.tensor([request.prompt_ids])
            mask = torch.ones_like(ids)
            base_logits, base_cache = self.base.step(ids, mask)
            rw_logits, rw_cache = self._reweigh(ids, mask, None)
            if request.streamer is not None:
                request.streamer.put(ids)
        except BaseException as err:  # noqa: BLE001 - the request fails, the engine goes on
            request.done.set_exception(err)
            return
        length = max(ids.shape[1], self.mask.shape[1] if self.mask is not None else 0)
        if self.mask is None:
            self.mask = _pad_left(mask, length, 1)
        else:
            self.mask = torch.cat((_pad_left(self.mask, length, 1), _pad_left(mask, length, 1)))
        self.base_cache = _joined(self.base_cache, base_cache, length)
        if rw_cache is not None:
            self.rw_cache = _joined(self.rw_cache, rw_cache, length)
        self.base_logits = base_logits if self.base_logits is None else torch.cat((self.base_logits, base_logits))
        self.rw_logits = rw_logits if self.rw_logits is None else torch.cat((self.rw_logits, rw_logits))
        self.rows.append(request)

    def _reweigh(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache | None):
        device = next(self.reweighter.parameters()).device
        if self.context_free:
            return self.reweighter(ids[:, -1:].to(device)).logits[:, -1].float(), None
        out = self.reweighter(input_ids=ids.to(device), attention_mask=mask.to(device),
                              position_ids=position_ids_from_mask(mask)[:, -ids.shape[1]:].to(device),
                              past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float(), out.past_key_values

    def _choose(self, row: int, request: Request) -> int:
        base, rw = self.base_logits[row:row + 1], self.rw_logits[row:row + 1].to(self.base_logits.device)
        if self.penalty is not None and request.generated:
            seen = torch.tensor([request.generated], device=base.device)
            penalty = RepetitionPenaltyLogitsProcessor(self.penalty)
            base, rw = penalty(seen, base.clone()), penalty(seen, rw.clone())
        scores = combine_log_probs(base, rw)
        if len(request.generated) < request.min_new_tokens:
            scores[..., self.eos] = -float("inf")
        if not request.temperature:
            return int(scores.argmax(-1))
        scores = TemperatureLogitsWarper(float(request.temperature))(None, scores)
        if request.top_p < 1.0:
            scores = TopPLogitsWarper(float(request.top_p))(None, scores)
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def _step(self) -> None:
        chosen, keep = [], []
        for row, request in enumerate(self.rows):
            if request.cancel.is_set():
                self._finish(request, "cancelled")
                continue
            token = self._choose(row, request)
            request.generated.append(token)
            try:
                if request.streamer is not None:
                    request.streamer.put(torch.tensor([token]))
            except Exception:  # noqa: BLE001 - the streamer's reader has gone (RequestCancelled)
                self._finish(request, "cancelled")
                continue
            if token == self.eos:
                self._finish(request, "stop")
            elif len(request.generated) >= request.max_new_tokens:
                self._finish(request, "length")
            else:
                chosen.append(token)
                keep.append(row)
        self.steps += 1
        if len(keep) < len(self.rows):
            self._keep(keep)
        if not self.rows:
            self._reset()
            return
        ids = torch.tensor(chosen)[:, None]
        self.mask = torch.cat((self.mask, self.mask.new_ones(len(keep), 1)), dim=1)
        self.base_logits, self.base_cache = self.base.step(ids, self.mask, self.base_cache)
        self.rw_logits, self.rw_cache = self._reweigh(ids, self.mask, self.rw_cache)

    def _keep(self, rows: list[int]) -> None:
        """Only ``rows`` of the batch go on (the others finished); padding columns no row needs
        any more are cut from the left."""
        self.rows = [self.rows[i] for i in rows]
        if not rows:
            return
        index = torch.tensor(rows)
        self.mask = self.mask[index]
        start = int((self.mask.sum(0) > 0).nonzero()[0])
        self.mask = self.mask[:, start:]
        for cache in (self.base_cache, self.rw_cache):
            if cache is not None:
                for layer in cache.layers:
                    layer.keys = layer.keys[index.to(layer.keys.device), :, start:]
                    layer.values = layer.values[index.to(layer.values.device), :, start:]
        self.base_logits = self.base_logits[index.to(self.base_logits.device)]
        self.rw_logits = self.rw_logits[index.to(self.rw_logits.device)]

    def _finish(self, request: Request, reason: str) -> None:
        if request.streamer is not None:
            try:
                request.streamer.end()
            except Exception:  # noqa: BLE001 - nobody reads it any more
                pass
        if not request.done.done():
            request.done.set_result((list(request.generated), reason))
