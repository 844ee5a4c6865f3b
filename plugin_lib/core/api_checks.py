"""What an API black box checks of its server before any work, and the parsing of its answers.

``ServerChecks`` is the part of ``core.api.ApiBlackBox`` that talks to the server about the
server itself: that it answers and serves the configured model (``check_server``), that it
tokenizes like the local tokenizer and how it keys its log-probabilities (``check_tokenizer``,
``_choose_key_style``), and which echo alignment it follows (``detect_echo_alignment``,
measured against single-position requests). It uses the box's requests (``_complete``,
``_encode``, ``_text``) and state (``client``, ``tokenizer``, ``k``, ``model``, ``key_map``),
so it is a mixin of ``ApiBlackBox`` only. ``_choice``, ``_single_top`` and ``_top_distance``
read the completions answers both use.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .api_client import ApiError, ApiRequestError, NoLogProbs, TokenizerMismatch
from .token_keys import ECHO_ALIGNMENTS, KEY_STYLES, KeyMap, echo_entries, token_keys

# Largest mean difference (nats) between an echoed entry and a single request for the same
# position under the right alignment (``ServerChecks._measure_echo_alignment``).
ECHO_TOLERANCE = 0.5


class ServerChecks:
    """The server checks of ``ApiBlackBox`` (module docstring)."""

    def check_server(self) -> None:
        """The server answers (``/v1/models``), and the request's ``model`` is known."""
        try:
            answer = self.client.get("/v1/models")
        except ApiRequestError as err:
            if err.status != 404:
                raise
            return  # a server without the listing: the configured model (or none) is sent as is
        served = [m.get("id") for m in answer.get("data", []) if isinstance(m, dict)]
        if self.model is None:
            if len(served) != 1:
                raise ApiRequestError(f"The server serves {len(served)} models ({served[:5]}); name the one to use "
                                      "(model: in the configuration).")
            self.model = served[0]
        elif served and self.model not in served:
            raise ApiRequestError(f"The server does not serve model {self.model!r}; it serves {served[:5]}.")

    def check_tokenizer(self, samples: Sequence[str] | None = None) -> None:
        """``TokenizerMismatch`` unless the server tokenizes like the local tokenizer.

        The samples (by default ``_tokenizer_samples``: prose, digits, whitespace, special tokens,
        and the texts of the vocabulary's last ids, which a smaller or other vocabulary lacks)
        go to the server's tokenize endpoint where it has one (llama-cpp-python's
        ``/extras/tokenize``, vLLM's ``/tokenize``), and one completion request checks the
        token count, that log-probabilities come back (k of them), and the style of their keys.
        """
        samples = list(samples) if samples is not None else self._tokenizer_samples()
        remote = self._remote_tokenize(samples)
        if remote is not None:
            for text, server_ids in zip(samples, remote):
                local = self._encode(text)
                if server_ids != local:
                    raise TokenizerMismatch(
                        f"The server tokenizes {text[:60]!r} as {server_ids[:12]}..., the local tokenizer as "
                        f"{local[:12]}...: the tokenizer in the configuration is not the server's. The "
                        "reweighting model needs the server's vocabulary: point the configuration at a "
                        "local copy of the served model's tokenizer.")
        probe = "The capital of France is Paris, and the capital of Italy is"
        answer = self._complete(probe, echo=False, phase="checks")
        top = _single_top(answer, probe)
        self._choose_key_style(top)
        served = (answer.get("usage") or {}).get("prompt_tokens")
        if served is not None and served != len(self._encode(probe)):
            raise TokenizerMismatch(f"The server counts {served} tokens in {probe!r}, the local tokenizer "
                                    f"{len(self._encode(probe))}: the tokenizers differ (or the server adds a BOS "
                                    "token; only servers that take the text as it is are supported).")
        # Keys of several tokens can coincide, so a few of the k may share a key; far fewer
        # than k means the server caps k without saying so.
        if len(top) < math.floor(0.9 * min(self.k, self.vocab_size)):
            raise ApiRequestError(f"Asked for k={self.k} log-probabilities per position, the server returned "
                                  f"{len(top)}: its limit is lower. Use k <= {len(top)}.")

    def _tokenizer_samples(self) -> list[str]:
        last = [self.tokenizer.decode([i]) for i in range(self.vocab_size - 1, self.vocab_size - 40, -1)
                if self._exact[i]][:8]
        specials = "".join(t for t in (self.tokenizer.bos_token, self.tokenizer.eos_token) if t)
        return ["The quick brown fox jumps over the lazy dog.", "  Prices: £20-25, 3.14159 and 1,000,000!\n\tok",
                f"{specials}user\nhello{specials}", "Ünïcödé ✓ 東京 naïve café", " ".join(last)]

    def _remote_tokenize(self, samples: Sequence[str]) -> list[list[int]] | None:
        attempts = [("/extras/tokenize", lambda t: {"input": t}, lambda a: a["tokens"]),
                    ("/tokenize", lambda t: {"prompt": t, "model": self.model, "add_special_tokens": False},
                     lambda a: a["tokens"])]
        for path, body, tokens in attempts:
            try:
                return [list(tokens(self.client.post(path, body(text)))) for text in samples]
            except ApiRequestError as err:
                if err.status not in (404, 405):
                    raise
            except (KeyError, TypeError):
                continue
        return None

    def _choose_key_style(self, top: dict[str, float]) -> None:
        if self.key_map is not None:
            return
        for style in KEY_STYLES:
            keys = token_keys(self.tokenizer, style, self._pieces)
            key_map = KeyMap(keys, self.eos_token_id, self._exact)
            if all(key_map.known(k) for k in top):
                self.key_style, self.key_map = style, key_map
                return
        raise TokenizerMismatch(f"The server's token keys {list(top)[:8]!r} match no style of the local tokenizer "
                                f"({', '.join(KEY_STYLES)}): the tokenizer in the configuration is not the server's.")

    def detect_echo_alignment(self) -> str:
        """Which of ``ECHO_ALIGNMENTS`` this server's echo follows: measured once, on a text
        with and one without a leading BOS token, against single-position requests."""
        with self._echo_lock:
            if self.echo_alignment is None:
                self.echo_alignment = self._measure_echo_alignment()
        return self.echo_alignment

    def _measure_echo_alignment(self) -> str:
        # The server's own numbers differ a little between one echo (all positions in one batch)
        # and single requests (one new position on a reused cache): llama.cpp's quantised
        # kernels depend on the batch size, by up to a few tenths of a nat on Q4 weights. The
        # wrong alignment compares distributions of different positions: nats apart, and other
        # tokens on top.
        probes = ["The capital of France is Paris, and the capital of Italy is"]
        if self.tokenizer.bos_token:
            probes.append(f"{self.tokenizer.bos_token}user\nThe capital of France is")
        distance = dict.fromkeys(ECHO_ALIGNMENTS, 0.0)
        for text in probes:
            ids = self._encode(text)
            answer = self._complete(text, echo=True, phase="checks")
            tops = (_choice(answer).get("logprobs") or {}).get("top_logprobs") or []
            if not tops:
                raise NoLogProbs("The server answers echo requests without log-probabilities: use "
                                 "teacher_forcing='stepwise'.")
            truth = {length: _single_top(self._complete(self._text(ids[:length]), echo=False, phase="checks"), text)
                     for length in (len(ids) - 1, len(ids))}
            for alignment in ECHO_ALIGNMENTS:
                entries = echo_entries(ids, alignment, self.tokenizer.bos_token_id)
                where = {length: j for j, (length, _) in enumerate(entries)}
                if len(tops) != len(entries) or any(length not in where for length in truth):
                    distance[alignment] = math.inf
                    continue
                for length, top in truth.items():
                    distance[alignment] = max(distance[alignment], _top_distance(tops[where[length]], top))
        matching = [a for a, d in distance.items() if d <= ECHO_TOLERANCE]
        if len(matching) != 1:
            raise ApiError(f"The server's echoed log-probabilities match {matching or 'none'} of the known "
                           f"alignments {ECHO_ALIGNMENTS} (largest mean difference per alignment: {distance}): "
                           "use teacher_forcing='stepwise'.")
        return matching[0]


def _choice(answer: dict) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise NoLogProbs(f"The server's answer has no choices: {str(answer)[:200]}")
    return choices[0]


def _single_top(answer: dict, text: str) -> dict[str, float]:
    """The next-token ``{key: log-prob}`` of a ``max_tokens: 1, echo: false`` answer."""
    choice = _choice(answer)
    tops = (choice.get("logprobs") or {}).get("top_logprobs")
    if not tops or not tops[0]:
        stopped = choice.get("finish_reason") == "stop"
        raise NoLogProbs(
            f"The server returned no log-probabilities after {text!r}"
            + (" (it stopped at once: the most likely token ends generation, and the server ignored logit_bias)"
               if stopped else "") + ". The Plugin needs the top-k log-probabilities of every step.")
    return tops[0]


def _top_distance(a: dict | None, b: dict | None) -> float:
    """How far apart two ``{key: log-prob}`` answers are: the mean absolute difference on the
    keys both report; infinite when they disagree on the most likely key or share under half."""
    if not a or not b:
        return math.inf
    shared = set(a) & set(b)
    if len(shared) < min(len(a), len(b)) / 2 or max(a, key=a.get) != max(b, key=b.get):
        return math.inf
    return sum(abs(a[key] - b[key]) for key in shared) / len(shared)
