"""One KV cache of a reweighting model for a changing batch of requests: an engine's requests
join, leave and move while they decode (vLLM's persistent batch), and each step feeds every
request only the tokens it has not seen: the requests under way one token each in one forward
call, the ones that join in a second.

Every row is right-aligned (left-padded) to the cache's length with an attention mask. New
requests prefill apart, then join, left-padded; a finished one is dropped; a column that no row
needs any more is trimmed. Positions are each request's own (0 at its first token), so a
request's logits are those it would get decoded alone. ``serving.vllm_processor`` runs it inside
vLLM; nothing here imports vLLM, so the bookkeeping is tested in the package's own environment.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, GPT2LMHeadModel, LlamaForCausalLM


@dataclass
class Request:
    """One request of the batch, as the processor follows it."""

    prompt: list[int]
    output: list[int]  # vLLM's own list: it grows as tokens are sampled
    plugin: bool
    penalty: float | None
    fed: int = 0  # tokens the reweighting model has seen
    last: torch.Tensor | None = None  # its features after them (a step with no new token reuses them)
    key: object = field(default_factory=object)  # its identity in the cache

    def unfed(self) -> list[int]:
        """The tokens the reweighting model has not seen (without copying the whole history)."""
        before = self.fed - len(self.prompt)
        return self.output[before:] if before >= 0 else self.prompt[self.fed:] + self.output


class BatchCache:
    """The reweighting model's KV cache for several requests at once: row i belongs to
    ``keys[i]``; every row is right-aligned (left-padded) to the cache's length, with a mask."""

    def __init__(self, head_dtype: torch.dtype = torch.float32):
        self.head_dtype = head_dtype  # bfloat16: the output layer computes in it (an approximation, opt-in)
        self.keys: list[object] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, length), 1 where a row has a token
        self.head: torch.Tensor | None = None  # the output layer's weight, transposed (:func:`_forward`)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """r's logits from :func:`step`'s features (the last hidden states where the cache holds the
        output layer, else the logits themselves), in float32."""
        if self.head is None:
            return features.float()
        return (features.to(self.head_dtype) @ self.head).float()

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

    def join(self, other: "BatchCache") -> None:
        """``other``'s rows after this cache's, the shorter of the two left-padded (masked) to the longer."""
        if other.cache is None:
            return
        if self.cache is None:
            self.keys, self.cache, self.mask = list(other.keys), other.cache, other.mask
            return
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self._layers(), other._layers()):
            for name in ("keys", "values"):
                setattr(mine, name, torch.cat((_left_pad(getattr(mine, name), width, 2),
                                               _left_pad(getattr(theirs, name), width, 2))))
        self.mask = torch.cat((_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)))
        self.keys += other.keys

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
    """r's features at each request's newest position (rows in ``requests``' order; ``cache.logits``
    makes them logits: the output layer is left to the caller, which may fuse it with an addition),
    each request fed what it has not seen: the rows of the cache one token each, in one call; new requests (and one
    with several unseen tokens, which starts again) prefill in a second call, apart, so that the
    others' block stays one token wide, then join the cache. A request with nothing new keeps
    its last features."""
    if getattr(reweighter, "is_context_free", False):  # it reads the newest token alone
        last = torch.tensor([(r.prompt + r.output)[-1] for r in requests], device=device)
        return reweighter(last[:, None]).logits[:, -1]
    held = set(cache.keys)
    fresh = [r for r in requests if r.key not in held or len(r.unfed()) > 1]
    staying = {r.key for r in requests} - {r.key for r in fresh}
    cache.keep([k for k in cache.keys if k in staying])
    by_key = {r.key: r for r in requests}
    decoding = [by_key[k] for k in cache.keys]
    if any(r.unfed() for r in decoding):
        _feed(reweighter, cache, decoding, device)
    if fresh:
        part = BatchCache(cache.head_dtype)
        part.head, part.keys = cache.head, [r.key for r in fresh]
        for r in fresh:
            r.fed = 0
        _feed(reweighter, part, fresh, device)
        cache.head = part.head
        cache.join(part)
    cache.trim()
    return torch.stack([r.last for r in requests])


def _feed(reweighter, cache: BatchCache, rows: list[Request], device) -> None:
    """One forward call over ``cache``'s rows (``rows``, in its order), each fed its unseen tokens,
    left-padded within the block; each row's ``last`` features and ``fed`` count updated."""
    new = [r.unfed() for r in rows]
    width = max(len(tokens) for tokens in new)
    ids, block, positions = [], [], []
    for request, tokens in zip(rows, new):  # the block's last column is each row's newest token
        pad = [0] * (width - len(tokens))
        ids.append(pad + tokens)
        block.append(pad + [1] * len(tokens))
        positions.append(pad + list(range(request.fed, request.fed + len(tokens))))
    ids, block, positions = (torch.tensor(rows_of, dtype=torch.long) for rows_of in (ids, block, positions))
    mask = cache.extend(block.to(device))
    if cache.cache is None:
        cache.cache = DynamicCache()
    past, features = _forward(reweighter, cache, ids.to(device), mask, positions.to(device))
    cache.cache = past
    for k, (request, tokens) in enumerate(zip(rows, new)):
        if tokens:
            request.fed, request.last = request.fed + len(tokens), features[k]


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat((tensor.new_zeros(shape), tensor), dim=dim)


def _forward(reweighter, cache: BatchCache, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
    """(the cache after the block, the features at each row's last column). For the package's two
    reweighting families the body runs alone: the features are its last hidden states, and the
    cache keeps the output layer's weight transposed and contiguous (``cache.logits``: the same
    products as the model's own head, about a fifth faster on a CPU, where the head is the bulk of
    a step; in the cache's ``head_dtype``: bfloat16 halves the head's time where the CPU has its
    instructions). Other models give their logits."""
    if not isinstance(reweighter, _HEADED) or getattr(reweighter.get_output_embeddings(), "bias", None) is not None:
        out = reweighter(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache.cache,
                         use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[:, -1]
    weight = reweighter.get_output_embeddings().weight
    if cache.head is None or cache.head.shape != weight.t().shape:
        cache.head = weight.detach().t().contiguous().to(cache.head_dtype)
    out = reweighter.base_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                past_key_values=cache.cache, use_cache=True)
    return out.past_key_values, out.last_hidden_state[:, -1]


_HEADED = (LlamaForCausalLM, GPT2LMHeadModel)
