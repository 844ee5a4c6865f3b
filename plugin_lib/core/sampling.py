"""What one call of a black box's ``generate`` decodes, as one value checked once: ``DecodingRequest``.

The package decodes a base in process (transformers' ``generate``) and a base behind an API
(``core.api.ApiBlackBox.generate``) through one keyword surface, transformers', so that its
decoding code calls either alike. Where a caller builds the settings itself (the serving layer, from
a temperature) or a black box runs the decoding loop itself (the API's), they travel as this
dataclass instead of a dozen keywords.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True, kw_only=True)
class DecodingRequest:
    """How many tokens, and how each is chosen: the argmax, or a draw (``do_sample``) after
    ``temperature``, ``top_k`` and ``top_p`` (None: not applied). ``pad_token_id`` fills finished
    rows and ``eos_token_id`` (one id or several) ends them; None: the black box's own. The
    defaults are transformers'. A value out of range is a ValueError when the request is made."""

    max_new_tokens: int = 20
    min_new_tokens: int = 0  # the end of sequence is ruled out before this many tokens
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 1
    pad_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        if isinstance(self.eos_token_id, Sequence):  # a list, as transformers takes it: kept hashable
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.max_new_tokens < 0 or self.min_new_tokens < 0:
            raise ValueError(f"max_new_tokens and min_new_tokens must be at least 0; got {self.max_new_tokens}, "
                             f"{self.min_new_tokens}.")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be at least 1, got {self.num_beams}.")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be above 0 (greedy: do_sample=False), got {self.temperature}.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be at least 0 (0: no cut), got {self.top_k}.")

    @classmethod
    def from_temperature(cls, temperature: float, top_p: float, **fields) -> DecodingRequest:
        """OpenAI's convention: ``temperature`` 0 is greedy, anything above samples at it and
        ``top_p``, with no top-k cut (a model's generation_config may hold one: it is turned off)."""
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1]; got {temperature}, {top_p}.")
        if temperature == 0:
            return cls(do_sample=False, **fields)
        return cls(do_sample=True, temperature=float(temperature), top_p=float(top_p), **fields)

    def end_ids(self, default: int) -> set[int]:
        """The ids that end a row: ``eos_token_id``, else the black box's ``default``."""
        if isinstance(self.eos_token_id, int):
            return {self.eos_token_id}
        return set(self.eos_token_id or [default])

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers for the draw at ``temperature``, ``top_k`` and ``top_p``; none when greedy."""
        warpers = LogitsProcessorList()
        if not self.do_sample:
            return warpers
        if self.temperature is not None and self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            warpers.append(TopKLogitsWarper(self.top_k))
        if self.top_p is not None and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(self.top_p))
        return warpers

    def generate_kwargs(self) -> dict[str, Any]:
        """The request as keywords of transformers' ``generate``, which every black box takes. The
        sampling settings go only with ``do_sample`` (else transformers warns), ``top_k`` even when
        None (it replaces generation_config's 50); the ids only where set, and ``min_new_tokens``
        and ``num_beams`` only where they differ from the defaults."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        for name, value, unset in (("pad_token_id", self.pad_token_id, None), ("eos_token_id", self.eos_token_id, None),
                                   ("min_new_tokens", self.min_new_tokens, 0), ("num_beams", self.num_beams, 1)):
            if value != unset:
                kwargs[name] = list(value) if isinstance(value, tuple) else value
        return kwargs
