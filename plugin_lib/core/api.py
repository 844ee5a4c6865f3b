"""A black box behind an HTTP API: the OpenAI-compatible completions protocol.

``ApiBlackBox`` has the interface of the in-process top-k view (``core.blackbox.TopKBlackBox``):
``logits`` / ``logits_at`` give log-probabilities over the whole vocabulary, completed from the
server's top k by the same rule (``complete_top_k``), and ``generate`` decodes with the same
logits processors. The base-output cache, ``core.decode.generate`` and every method therefore
run over a model they reach only through ``POST /v1/completions``.

What is asked of the server, and how:

- **Teacher forcing** (the base-output cache), per (prompt, reference) pair, one of
  - ``"echo"``: one request, ``echo: true, logprobs: k, max_tokens: 1``: the top-k
    log-probabilities at every position of the echoed text. Which list entry holds which
    distribution is not the same on every server (``ECHO_ALIGNMENTS``); it is measured once
    against single-position requests (``detect_echo_alignment``), never assumed.
  - ``"stepwise"``: one request per target token, ``echo: false, max_tokens: 1`` on the text
    up to it. Needs no echo at all; on llama-cpp-python's server it is the cheaper one (its
    echo sorts the whole vocabulary in Python at every position, about 0.15 s each).
  A pair whose text prefixes do not tokenize back to the same ids is scored by echo.
- **Decoding**: greedy decoding asks the server for its own greedy continuation over several
  positions at once (``max_tokens: n``, the top k at each) and uses it while the chosen token
  is the server's (``ApiBlackBox.generate``): exactly one request per token's output, in fewer
  requests. Sampling asks one request per token (``max_tokens: 1``). The rows of a batch ask
  concurrently, at most ``max_concurrency`` requests in flight.

Prompts travel as text (llama-cpp-python accepts nothing else): token ids are decoded with the
local tokenizer, and the server's tokenization of the text is checked against them (the echoed
tokens, ``usage.prompt_tokens``, and once, at connection, its tokenize endpoint).

The local tokenizer must be the server's: the reweighting model works on the server's
vocabulary. ``check_tokenizer`` compares them on sample strings (including the last ids of the
vocabulary) and raises ``TokenizerMismatch``. The log-probabilities come back keyed by decoded
token text, not id; ``KeyMap`` maps them back (``KEY_STYLES``), and where several tokens
render alike it keeps the value for the one that matters (``KeyMap``).

Robustness: time-outs; retries with exponential backoff on 408/429/502/503/504 and on a 500
without a message (``Retry-After`` is honoured); a 4xx or a 500 with a message is the server
rejecting the request (llama-cpp-python answers validation errors with 500) and is raised at
once as ``ApiRequestError``; a server that does not answer gives ``ApiUnavailable``. The API
key is read from an environment variable at each request and kept nowhere else.

The HTTP is httpx's, not the official ``openai`` client's: that one retries every 5xx (so a
request llama-cpp-python rejected with a 500 would be sent again), keeps the key on the client
(read from ``OPENAI_API_KEY`` once, at construction) and refuses to start without one, which a
local server does not need.

Followed: the OpenAI completions reference (``logprobs``, ``echo``, ``logit_bias``) and
llama-cpp-python 0.3.36, ``llama_cpp/llama.py`` (``Llama._create_completion``: how echoed
entries pair tokens with score rows and skip the BOS id) and ``llama_cpp/_internals.py``
(``detokenize``: a 32-byte buffer per token), which fix the ``"llama-cpp-python"`` alignment
and key style below.

The parts: ``api_client`` (the HTTP client, its errors and usage), ``token_keys`` (token keys and
echo alignment), ``api_checks`` (the server checks and the answers' parsing), and here the
black box.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList, PreTrainedTokenizerBase

from .api_client import ApiRequestError, CompletionsClient, NoLogProbs, TokenizerMismatch, Usage
from .token_keys import KeyMap, echo_entries, token_bytes
from .api_checks import ServerChecks, _choice, _single_top
from .blackbox import DEFAULT_RULE, RULES, BlackBoxLM, complete_top_k
from .sampling import DecodingRequest

TEACHER_FORCING = ("stepwise", "echo")
# Positions asked per greedy decoding request (ApiBlackBox.generate): 1 is one request per token.
DEFAULT_SPECULATE = 8
# Sent with requests for several tokens, so that the server's own choice is its plain argmax:
# llama-cpp-python's server penalises repeats by default (repeat_penalty 1.1 over the last 64
# tokens, prompt included); presence and frequency penalties are 0 by default on every server.
PLAIN_ARGMAX = {"repeat_penalty": 1.0}
CHAT_ONLY = (
    "A chat endpoint returns log-probabilities only for the tokens it generates itself (OpenAI: "
    "the top 20 at most): it cannot score a reference text, so a Plugin cannot be trained through "
    "it, and it can decode only where it lets a request continue an assistant message the caller "
    "wrote. Training needs a completions endpoint (/v1/completions) with logprobs, e.g. vLLM, "
    "llama.cpp's server or TGI."
)


@dataclass
class Lookahead:
    """What one request said about a row's next positions. ``read``: the ids the server had
    read before the first of them (its tokenization of the text sent). Per position, the
    reported ``{key: log-prob}`` (``tops``) and the id of the token the server chose there
    itself (``tokens``; None where its key does not name one id for certain): position j+1 is
    the distribution after ``read`` and the server's own tokens up to j."""

    read: list[int]
    tops: list[dict[str, float]] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)

    def advance(self) -> int | None:
        """Drop the first position; the server's own token there, which it has now read."""
        self.tops.pop(0)
        token = self.tokens.pop(0)
        self.read.append(token)
        return token


class ApiBlackBox(ServerChecks, BlackBoxLM):
    """A model behind an OpenAI-compatible completions endpoint, seen as a top-k view.

    Args:
        client: the HTTP client (URL, key variable, time-out, retries, concurrency).
        tokenizer: the server's tokenizer, from a local copy (``check_tokenizer`` verifies it).
        k: log-probabilities per position (``logprobs``); ``max_k`` is the server's largest.
        rule: how the unreported tokens are filled in (``core.blackbox.RULES``).
        teacher_forcing: ``"stepwise"`` or ``"echo"`` (module docstring).
        model: the request's ``model`` field (None: the server's only model, from /v1/models).
        bias_end_tokens: send ``logit_bias`` -100 on the special tokens. llama-cpp-python
            returns no log-probabilities at all when its sampled token ends generation; the
            bias changes only which token it samples, not the log-probabilities it reports.
        speculate: positions asked per greedy decoding request (``generate``); 1 asks one
            request per generated token.
        check: run ``check_server`` and ``check_tokenizer`` now (a clear error before any work).
    """

    def __init__(self, client: CompletionsClient, tokenizer: PreTrainedTokenizerBase, k: int, *,
                 rule: str = DEFAULT_RULE, name: str = "api", teacher_forcing: str = "stepwise",
                 max_k: int | None = None, model: str | None = None, bias_end_tokens: bool = True,
                 speculate: int = DEFAULT_SPECULATE, check: bool = True):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        _check_speculate(speculate)
        if max_k is not None and k > max_k:
            raise ValueError(f"k={k} is above this server's limit of {max_k} log-probabilities per position "
                             "(max_k in its configuration): ask for at most that many.")
        if rule not in RULES:
            raise ValueError(f"Unknown top-k rule {rule!r}; choose one of {RULES}.")
        if teacher_forcing not in TEACHER_FORCING:
            raise ValueError(f"teacher_forcing must be one of {TEACHER_FORCING}, got {teacher_forcing!r}.")
        self.client, self.tokenizer, self.name = client, tokenizer, name
        self.k, self.rule, self.teacher_forcing, self.max_k, self.model = k, rule, teacher_forcing, max_k, model
        self.speculate = speculate
        self._vocab_size = len(tokenizer)
        self._pieces = token_bytes(tokenizer)
        self._exact = [b is not None and _strict_utf8(b) for b in self._pieces]
        self.key_style: str | None = None
        self.key_map: KeyMap | None = None
        self.echo_alignment: str | None = None
        special = sorted({i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
                         | set(tokenizer.all_special_ids))
        self._logit_bias = {str(i): -100 for i in special} if bias_end_tokens else None
        self._plain_argmax = dict(PLAIN_ARGMAX)  # emptied if the server refuses the fields
        self._echo_lock = threading.Lock()
        if check:
            self.check_server()
            self.check_tokenizer()

    # -- the BlackBoxLM interface

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def usage(self) -> Usage:
        return self.client.usage

    def output_head(self) -> None:
        """None: a server returns log-probabilities only, so its cache holds them (top-k filled in)."""
        return None

    def __repr__(self) -> str:
        return (f"ApiBlackBox({self.name!r}, {self.client.root!r}, k={self.k}, rule={self.rule!r}, "
                f"teacher_forcing={self.teacher_forcing!r}, speculate={self.speculate}, "
                f"vocab_size={self.vocab_size})")

    # -- requests

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _complete(self, text: str, *, echo: bool, phase: str, max_tokens: int = 1) -> dict:
        body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "logprobs": self.k, "echo": echo}
        if self.model is not None:
            body["model"] = self.model
        if self._logit_bias:
            body["logit_bias"] = self._logit_bias
        plain = self._plain_argmax if max_tokens > 1 else {}
        body.update(plain)
        try:
            answer = self.client.post("/v1/completions", body, phase=phase)
        except ApiRequestError as err:
            if any(name in str(err) for name in plain):  # a server without the field (OpenAI's refuses unknown ones)
                self._plain_argmax = {}
                return self._complete(text, echo=echo, phase=phase, max_tokens=max_tokens)
            if err.status in (404, 405):
                raise ApiRequestError(f"{err} The server has no completions endpoint. {CHAT_ONLY}", err.status) from None
            if "logprobs" in str(err):
                raise ApiRequestError(f"{err} (asked for logprobs={self.k}: a server's largest k may be lower, "
                                      "e.g. vLLM's --max-logprobs, 20 by default; llama.cpp's server needs "
                                      "--logits_all true)", err.status) from None
            raise
        usage = answer.get("usage") or {}
        self.client.count(phase, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                           completion_tokens=int(usage.get("completion_tokens") or 0))
        return answer

    def _distribution(self, top: dict[str, float]) -> torch.Tensor:
        """A full-vocabulary log-probability vector from the server's ``{key: log-prob}``."""
        values = self.key_map.to_ids(top)
        if len(values) > self.k:  # an echoed entry also carries its own token's value
            values = dict(sorted(values.items(), key=lambda kv: kv[1], reverse=True)[: self.k])
        ids = torch.tensor(list(values), dtype=torch.long)
        reported = torch.tensor(list(values.values()), dtype=torch.float32)
        reported, fill = complete_top_k(reported, self.vocab_size, self.rule)
        return torch.full((self.vocab_size,), fill.item()).index_copy_(0, ids, reported)

    def next_token_log_probs(self, ids: Sequence[int], *, phase: str = "decoding") -> torch.Tensor:
        """The completed next-token log-probabilities (V,) after ``ids``: one request."""
        return self._distribution(self.continuation(ids, 1, phase=phase).tops[0])

    def continuation(self, ids: Sequence[int], n: int, *, phase: str = "decoding") -> "Lookahead":
        """The server's own greedy continuation of ``ids`` over up to ``n`` positions, with the
        top-k log-probabilities at each: one request (``max_tokens: n``). Fewer positions where
        the server stopped early, and none from the first position without log-probabilities;
        the first position is always there (else ``NoLogProbs``)."""
        text = self._text(ids)
        answer = self._complete(text, echo=False, phase=phase, max_tokens=n)
        first = _single_top(answer, text[-60:])
        self._choose_key_style(first)
        read = self._encode(text)
        served = (answer.get("usage") or {}).get("prompt_tokens")
        if served is not None and served != len(ids):
            self.client.count(phase, retokenized=1)
        logprobs = _choice(answer).get("logprobs") or {}
        tops, tokens = logprobs["top_logprobs"], logprobs.get("tokens") or []
        ahead = Lookahead(read)
        for j, top in enumerate(tops[:n]):
            if not top:
                break
            ahead.tops.append(top)
            ahead.tokens.append(self.key_map.sole_id(tokens[j]) if j < len(tokens) else None)
        return ahead

    def echo_log_probs(self, ids: Sequence[int], lengths: Sequence[int], *, phase: str = "teacher_forcing"
                       ) -> dict[int, torch.Tensor]:
        """{L: next-token log-probabilities after ``ids[:L]``} for the ``lengths`` one echo request
        covers (the others are missing from the result)."""
        alignment = self.detect_echo_alignment()
        text = self._text(ids)
        answer = self._complete(text, echo=True, phase=phase)
        logprobs = _choice(answer).get("logprobs") or {}
        tops, tokens = logprobs.get("top_logprobs"), logprobs.get("tokens")
        if not tops:
            raise NoLogProbs(f"The server echoed no log-probabilities for {text[-60:]!r}: it cannot teach-force "
                             "by echo here; use teacher_forcing='stepwise'.")
        entries = echo_entries(ids, alignment, self.tokenizer.bos_token_id)
        if len(tops) not in (len(entries), len(entries) - 1):
            raise TokenizerMismatch(f"The server echoed {len(tops)} positions for a text of {len(ids)} tokens "
                                    f"(expected {len(entries)}): it tokenized the text differently.")
        keys = self.key_map.keys if self.key_map is not None else None
        wanted, out = set(lengths), {}
        for j, ((length, token), top) in enumerate(zip(entries, tops)):
            if token is not None and tokens is not None and keys is not None and tokens[j] != keys[token]:
                raise TokenizerMismatch(f"Echoed token {j} is {tokens[j]!r}, the local tokenizer has "
                                        f"{keys[token]!r}: the server tokenized the text differently.")
            if length in wanted and top:
                self._choose_key_style(top)
                out[length] = self._distribution(top)
        return out

    # -- teacher forcing

    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Completed log-probabilities (N, V) at ``positions`` (row-major), requested from the server.

        Row r's position c holds the distribution after its real tokens up to c (left padding
        is dropped). ``"stepwise"`` asks one request per position; ``"echo"`` one per row, plus
        single requests for the positions an echo does not cover (its first token's).
        """
        started = time.perf_counter()
        rows = []
        for r in range(input_ids.shape[0]):
            real = attention_mask[r].bool()
            start = int(real.nonzero()[0]) if real.any() else input_ids.shape[1]
            ids = input_ids[r, start:].tolist()
            if not bool(real[start:].all()):
                raise ValueError("logits_at needs left-padded rows (padding first, then the tokens).")
            wanted = [c - start + 1 for c in positions[r].nonzero().flatten().tolist()]
            if any(length < 1 for length in wanted):
                raise ValueError("A requested position lies in the padding.")
            rows.append((ids, wanted))
        with ThreadPoolExecutor(max_workers=self.client.max_concurrency) as pool:
            results = list(pool.map(lambda row: self._row_log_probs(*row), rows))
        out = [result[length] for (ids, wanted), result in zip(rows, results) for length in wanted]
        self.client.count("teacher_forcing", items=sum(bool(w) for _, w in rows),
                           positions=len(out), seconds=time.perf_counter() - started)
        return torch.stack(out) if out else torch.empty(0, self.vocab_size)

    def _row_log_probs(self, ids: list[int], lengths: list[int]) -> dict[int, torch.Tensor]:
        if not lengths:
            return {}
        stepwise_ok = all(self._encode(self._text(ids[:length])) == ids[:length] for length in lengths)
        if self.teacher_forcing == "stepwise" and stepwise_ok:
            return {length: self.next_token_log_probs(ids[:length], phase="teacher_forcing") for length in lengths}
        if self._encode(self._text(ids)) != ids:
            raise TokenizerMismatch(f"The token ids of {self._text(ids)[-80:]!r} do not survive as text (the "
                                    "tokenizer encodes their text differently), and the server takes text only.")
        found = self.echo_log_probs(ids, lengths)
        for length in (m for m in lengths if m not in found):
            if self._encode(self._text(ids[:length])) != ids[:length]:
                raise TokenizerMismatch(f"No echoed distribution after {self._text(ids[:length])[-60:]!r}, and that "
                                        "prefix does not survive as text.")
            found[length] = self.next_token_log_probs(ids[:length], phase="teacher_forcing")
        return found

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Completed log-probabilities (B, T, V) at every real position (uniform on padding)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        real = attention_mask.bool()
        out = torch.full((*input_ids.shape, self.vocab_size), -math.log(self.vocab_size))
        out[real] = self.logits_at(input_ids, attention_mask, real)
        return out

    # -- decoding

    def step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values=None):
        raise NotImplementedError("A black box behind an API has no KV cache here: decode with generate.")

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 logits_processor: Sequence[Callable] | None = None, streamer=None, speculate: int | None = None,
                 **decoding) -> torch.Tensor:
        """Greedy decoding or sampling, called as transformers' ``generate`` is: ``decoding`` holds
        the keywords of ``core.sampling.DecodingRequest`` (``max_new_tokens``, ``do_sample``,
        ``temperature``, ``top_p`` ...), the part of transformers' the package uses.
        ``logits_processor`` runs on the completed log-probabilities, all rows at each step; a
        finished row is padded. Beam search is not offered over an API.

        Greedy decoding is speculative: a row asks the server for its own greedy continuation
        over ``speculate`` positions (default: the constructor's) with the top k at each, and
        uses them step by step while the token chosen (after the processors) is the one the
        server chose; at the first other token it asks again from the new prefix. Every
        distribution used is therefore the server's for exactly the current prefix: the output
        is that of one request per token (``speculate=1``), in fewer requests. A server token
        is taken as chosen only where its key names one id, and only where the new prefix's
        text tokenizes to the ids the server has read (a request with that text would read
        the same). Sampling asks one position per request.

        ``streamer``: a transformers streamer (e.g. ``TextIteratorStreamer``), for a batch of
        one row: given the prompt, then each new token, then ``end()``.
        """
        request = DecodingRequest(**decoding)
        if request.num_beams != 1:
            raise NotImplementedError("Beam search is not available over an API black box: decode greedily or sample.")
        speculate = self.speculate if speculate is None else _check_speculate(speculate)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"A streamer follows one row; this batch has {input_ids.shape[0]}.")
        processors = LogitsProcessorList(list(logits_processor or []))
        if streamer is not None:
            streamer.put(input_ids.cpu())
        sequences = self._decode(input_ids, attention_mask, request, processors, speculate, streamer)
        if streamer is not None:
            streamer.end()
        return sequences

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, request: DecodingRequest,
                processors: LogitsProcessorList, speculate: int, streamer) -> torch.Tensor:
        """``generate``'s loop, its arguments checked: prompt + new ids, one step for all rows at a time."""
        eos = request.end_ids(self.eos_token_id)
        pad = request.pad_token_id if request.pad_token_id is not None else self.tokenizer.pad_token_id
        warpers = request.warpers()
        rows, limit = input_ids.shape[0], request.max_new_tokens
        prefixes = [input_ids[r][attention_mask[r].bool()].tolist() for r in range(rows)]
        ahead: list[Lookahead | None] = [None] * rows
        sequences = input_ids.clone()
        done = torch.zeros(rows, dtype=torch.bool)
        uniform = -math.log(self.vocab_size)
        with ThreadPoolExecutor(max_workers=self.client.max_concurrency) as pool:
            for step in range(limit):
                started = time.perf_counter()
                live = [r for r in range(rows) if not done[r]]
                # No position past the last step is asked for; sampling uses one per request.
                n = 1 if request.do_sample else min(speculate, limit - step)
                asking = [r for r in live if ahead[r] is None]
                for r, found in zip(asking, pool.map(lambda r: self.continuation(prefixes[r], n), asking)):
                    ahead[r] = found
                received = sum(len(ahead[r].tops) for r in asking)
                scores = torch.full((rows, self.vocab_size), uniform)
                for r in live:
                    scores[r] = self._distribution(ahead[r].tops[0])
                scores = processors(sequences, scores)
                if step < request.min_new_tokens:
                    scores[:, sorted(eos)] = -math.inf
                if request.do_sample:
                    probs = torch.softmax(warpers(sequences, scores), dim=-1)
                    chosen = torch.multinomial(probs, 1).squeeze(1)
                else:
                    chosen = scores.argmax(-1)
                chosen = chosen.masked_fill(done, pad)
                sequences = torch.cat((sequences, chosen[:, None]), dim=1)
                done |= torch.isin(chosen, torch.tensor(sorted(eos)))
                accepted = 0
                for r in live:
                    token = int(chosen[r])
                    prefixes[r].append(token)
                    if not done[r] and self._follows(ahead[r], token, prefixes[r]):
                        accepted += 1
                    else:
                        ahead[r] = None
                self.client.count("decoding", items=len(live), positions=received, accepted=accepted,
                                  seconds=time.perf_counter() - started)
                if streamer is not None:
                    streamer.put(chosen.cpu())
                if done.all():
                    break
        return sequences

    def _follows(self, ahead: Lookahead, token: int, prefix: list[int]) -> bool:
        """Whether ``ahead``'s next position is the server's distribution after ``prefix``,
        whose last id ``token`` was just chosen: the server chose it too, a position is left,
        and ``prefix``'s text reads as what the server has read (the one test that costs more
        than a comparison comes last)."""
        own = ahead.advance()
        return own == token and bool(ahead.tops) and self._encode(self._text(prefix)) == ahead.read


def _check_speculate(speculate: int) -> int:
    if isinstance(speculate, bool) or not isinstance(speculate, int) or speculate < 1:
        raise ValueError(f"speculate must be a positive integer (1: one request per token), got {speculate!r}")
    return speculate


def _strict_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return len(raw) <= 32
    except UnicodeDecodeError:
        return False

