"""One KV cache of a reweighting model for a changing batch of requests: an engine's requests
join, leave and move while they decode (vLLM's persistent batch), and each step feeds every
request only the tokens it has not seen, all of them in one forward call.

Every row is right-aligned (left-padded) to the cache's length with an attention mask; a new row
starts empty over that length, a finished one is dropped, and columns that no row needs any more
are trimmed. Positions are each request's own (0 at its first token), so a request's
logits are those it would get decoded alone. ``serving.vllm_processor`` runs it inside vLLM;
nothing here imports vLLM, so the bookkeeping is tested in the package's own environment.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache


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
        """Drop the columns that no row has a token in (those of requests that left, and the
        padding of a block that fed one request more tokens than the others)."""
        if self.mask is None:
            return
        used = self.mask.bool().any(0)
        if bool(used.all()):
            return
        kept = used.nonzero().squeeze(1)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys.index_select(2, kept), layer.values.index_select(2, kept)
        self.mask = self.mask.index_select(1, kept)


def step(reweighter: torch.nn.Module, cache: BatchCache, requests: list[Request], device) -> torch.Tensor:
    """r's logits at each request's newest position (rows in ``requests``' order): one call, each
    request fed what it has not seen; a request with nothing new keeps its last logits."""
    if getattr(reweighter, "is_context_free", False):  # it reads the newest token alone
        last = torch.tensor([(r.prompt + r.output)[-1] for r in requests], device=device)
        return reweighter(last[:, None]).logits[:, -1]
    keys = [r.key for r in requests]
    wanted, held = set(keys), set(cache.keys)
    cache.keep([k for k in cache.keys if k in wanted])
    cache.add([k for k in keys if k not in held])
    by_key = {r.key: r for r in requests}
    ordered = [by_key[k] for k in cache.keys]
    new = [r.unfed() for r in ordered]
    width = max(len(ids) for ids in new)
    if width == 0:  # nothing new for any request: each keeps its last logits
        return torch.stack([by_key[k].last for k in keys])
    ids = torch.zeros(len(ordered), width, dtype=torch.long)
    block = torch.zeros(len(ordered), width, dtype=torch.long)
    positions = torch.zeros(len(ordered), width, dtype=torch.long)
    for k, (request, tokens) in enumerate(zip(ordered, new)):
        if tokens:  # left-padded within the block: its last column is each row's newest token
            ids[k, width - len(tokens):] = torch.tensor(tokens)
            block[k, width - len(tokens):] = 1
            positions[k, width - len(tokens):] = torch.arange(request.fed, request.fed + len(tokens))
    mask = cache.extend(block.to(device))
    if cache.cache is None:
        cache.cache = DynamicCache()
    out = reweighter(input_ids=ids.to(device), attention_mask=mask, position_ids=positions.to(device),
                     past_key_values=cache.cache, use_cache=True, logits_to_keep=1)
    cache.cache = out.past_key_values
    for k, (request, tokens) in enumerate(zip(ordered, new)):
        if tokens:
            request.fed, request.last = request.fed + len(tokens), out.logits[k, -1]
    cache.trim()
    return torch.stack([by_key[k].last for k in keys])
