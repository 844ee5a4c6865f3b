"""Which token a server's log-probability is for, and which position an echoed entry holds
(``core.api``). A server keys its top-k log-probabilities by decoded token text, not id;
``KeyMap`` maps them back for a key style (``KEY_STYLES``), keeping, where several tokens render
alike, the value of the one that matters. ``echo_entries`` pairs an echoed answer's entries with
positions under an alignment (``ECHO_ALIGNMENTS``: not the same on every server).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from .api_client import TokenizerMismatch

ECHO_ALIGNMENTS = ("openai", "llama-cpp-python")
KEY_STYLES = ("llama-cpp-python", "decoded", "token-ids")


def _byte_level_decoder() -> dict[str, int]:
    """Character -> byte of byte-level BPE vocabularies (GPT-2's scheme): printable Latin-1
    bytes stand for themselves, the other bytes for the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + extra)
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes | None]:
    """Each id's bytes (None for special tokens). Exact for byte-level BPE vocabularies; for
    others, the tokenizer's decoding of the id alone."""
    size = len(tokenizer)
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    special |= set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    decoder = _byte_level_decoder()
    byte_level = all(c in decoder for i, t in enumerate(tokens) if i not in special and t for c in t)
    out: list[bytes | None] = []
    for i, token in enumerate(tokens):
        if i in special:
            out.append(None)
        elif byte_level:
            out.append(bytes(decoder[c] for c in token))
        else:
            out.append(tokenizer.decode([i], clean_up_tokenization_spaces=False).encode("utf-8"))
    return out


def token_keys(tokenizer: PreTrainedTokenizerBase, style: str, pieces: list[bytes | None] | None = None) -> list[str]:
    """The key under which the server reports each id's log-probability (``KEY_STYLES``):

    - ``"llama-cpp-python"``: the id's bytes decoded as UTF-8 dropping invalid bytes; special
      tokens, and tokens longer than 32 bytes (its detokenize buffer), as ``""``;
    - ``"decoded"``: the tokenizer's decoding of the id alone, special tokens as their text
      (vLLM's default);
    - ``"token-ids"``: ``"token_id:<id>"`` (vLLM's ``--return-tokens-as-token-ids``), exact.
    """
    if style not in KEY_STYLES:
        raise ValueError(f"Unknown key style {style!r}; choose one of {KEY_STYLES}.")
    size = len(tokenizer)
    if style == "token-ids":
        return [f"token_id:{i}" for i in range(size)]
    if style == "decoded":
        return [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                for i in range(size)]
    pieces = pieces if pieces is not None else token_bytes(tokenizer)
    return ["" if b is None or len(b) > 32 else b.decode("utf-8", errors="ignore") for b in pieces]


class KeyMap:
    """Server keys back to token ids.

    Where several ids share a key (llama-cpp-python renders every special token as ``""``, and
    byte fragments of a character lose their incomplete bytes) the server keeps one value for
    them all: llama-cpp-python the last one written, the least likely of them in its top k. It
    goes to the end-of-sequence token when that shares the key (``""``: decoding must see when
    to stop), otherwise to the one id whose text the key is exactly; where no single id is, the
    key is ``ambiguous`` and its value is left to the completion rule, like an unreported
    token's. So where the end-of-sequence token and another special token are both in the top
    k, the end-of-sequence token gets the other's (lower) value: no request can tell them apart.
    """

    def __init__(self, keys: Sequence[str], eos_token_id: int | None, exact: Sequence[bool]):
        groups: dict[str, list[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            groups[key].append(i)
        self.keys = list(keys)
        self.ids: dict[str, int] = {}
        self.ambiguous: set[str] = set()
        self.shared = {key for key, members in groups.items() if len(members) > 1}
        for key, members in groups.items():
            exact_members = [i for i in members if exact[i]]
            if len(members) == 1:
                self.ids[key] = members[0]
            elif eos_token_id in members:
                self.ids[key] = eos_token_id
            elif len(exact_members) == 1:
                self.ids[key] = exact_members[0]
            else:
                self.ambiguous.add(key)

    def known(self, key: str) -> bool:
        return key in self.ids or key in self.ambiguous

    def sole_id(self, key: str | None) -> int | None:
        """The id of a key that no other id renders alike, else None. Only such a key names
        a token for certain (``ids`` gives a shared key's value to one of its ids)."""
        return None if key is None or key in self.shared else self.ids.get(key)

    def to_ids(self, top: dict[str, float]) -> dict[int, float]:
        """``{id: log-probability}`` of a server's ``{key: log-probability}``; unknown keys raise."""
        unknown = [k for k in top if not self.known(k)]
        if unknown:
            raise TokenizerMismatch(
                f"The server reported tokens the local tokenizer does not have: {unknown[:5]!r}. The tokenizer named "
                "in the configuration is not the server's (or its keys have another style).")
        return {self.ids[k]: float(v) for k, v in top.items() if k in self.ids and v is not None}


# ---------------------------------------------------------------- echo alignment


def echo_entries(ids: Sequence[int], alignment: str, bos_token_id: int | None) -> list[tuple[int, int | None]]:
    """For each entry of an echoed answer to the text of ``ids`` (plus one generated token):
    (L, token), meaning the entry holds the next-token distribution after ``ids[:L]`` and is
    labelled with ``token`` (None: the generated one).

    - ``"openai"``: entry i belongs to token i and holds the distribution it was drawn from
      (after ``ids[:i]``); entry 0 is null; the generated token's entry comes last.
    - ``"llama-cpp-python"``: score row i (the distribution after ``ids[:i+1]``) is paired with
      token i of ``ids`` (of ``ids[1:]`` when ``ids[0]`` is the BOS id), then the generated token;
      pairs whose token is the BOS id are dropped; the first entry kept is null. With a leading
      BOS this is the OpenAI alignment minus BOS-id tokens; without one it is shifted by one.
    """
    n = len(ids)
    if alignment == "openai":
        return [(i, ids[i]) for i in range(n)] + [(n, None)]
    if alignment != "llama-cpp-python":
        raise ValueError(f"Unknown echo alignment {alignment!r}; choose one of {ECHO_ALIGNMENTS}.")
    labels: list[int | None] = list(ids[1:] if n and ids[0] == bos_token_id else ids) + [None]
    return [(i + 1, labels[i]) for i in range(n) if labels[i] is None or labels[i] != bos_token_id]
