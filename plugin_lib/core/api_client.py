"""The HTTP side of a black box behind an OpenAI-compatible completions API (``core.api``):
its errors, what each phase of work cost (``Usage``), and ``CompletionsClient``: JSON over
httpx with time-outs, retries (tenacity) with backoff on 408/429/502/503/504 and on a 500
without a message (``Retry-After`` honoured), a cap on requests in flight, and the API key
read from an environment variable at each request and kept nowhere else.
"""
from __future__ import annotations

import json
import os
import random
import threading
from dataclasses import dataclass, field

import httpx
import tenacity

RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})
PHASES = ("checks", "teacher_forcing", "decoding")


class ApiError(RuntimeError):
    """Something went wrong talking to the model's server."""


class ApiUnavailable(ApiError):
    """No answer: the server is down, unreachable, or kept failing after the retries."""


class ApiRequestError(ApiError):
    """The server answered, and rejected the request (a 4xx, or a 500 with a message)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class _Transient(Exception):
    """A failure another attempt may not have: no answer, or a status worth retrying."""

    def __init__(self, failure: str, retry_after: float | None = None):
        super().__init__(failure)
        self.retry_after = retry_after


class NoLogProbs(ApiError):
    """The answer carries no log-probabilities where the protocol needs them."""


class TokenizerMismatch(ApiError):
    """The local tokenizer is not the server's: ids and vocabulary would not line up."""


@dataclass
class PhaseUsage:
    """What one phase of work cost: requests, retried attempts, the tokens the server counted,
    wall time, and the work done (``items``: pairs scored or tokens generated; ``positions``:
    next-token distributions received; ``accepted``: generated tokens that were the server's
    own greedy choice, so that the next step used a distribution an earlier request had
    already returned: ``ApiBlackBox.generate``)."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    items: int = 0
    positions: int = 0
    retokenized: int = 0  # requests whose text the server tokenized into another number of tokens
    accepted: int = 0

    def minus(self, other: "PhaseUsage") -> "PhaseUsage":
        return PhaseUsage(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})


@dataclass
class Usage:
    """Per phase (``PHASES``): checks at connection, teacher forcing, decoding."""

    phases: dict[str, PhaseUsage] = field(default_factory=lambda: {p: PhaseUsage() for p in PHASES})

    def snapshot(self) -> "Usage":
        return Usage({p: PhaseUsage(**vars(u)) for p, u in self.phases.items()})

    def minus(self, other: "Usage") -> "Usage":
        return Usage({p: self.phases[p].minus(other.phases[p]) for p in PHASES})

    def as_dict(self) -> dict[str, dict]:
        return {p: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(u).items()}
                for p, u in self.phases.items()}


# ---------------------------------------------------------------- the HTTP client


class CompletionsClient:
    """JSON over HTTP to an OpenAI-compatible server, through one ``httpx.Client``: its
    keep-alive connections (at most ``max_concurrency``) are reused from request to request.

    ``base_url`` is the server's root or its ``/v1`` (``http://127.0.0.1:8080`` or
    ``http://127.0.0.1:8080/v1``). The API key is read from the environment variable
    ``api_key_env`` at every request: it is never stored on the object, logged or shown.
    ``close()`` (or ``with``) closes the connections; they also close with the object.
    """

    def __init__(self, base_url: str, *, api_key_env: str | None = "PLUGIN_API_KEY", timeout_s: float = 120.0,
                 max_retries: int = 4, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 max_concurrency: int = 4):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL such as 'http://127.0.0.1:8080', got {base_url!r}.")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0 and timeout_s > 0 are needed.")
        root = base_url.rstrip("/")
        self.root = root.removesuffix("/v1")
        self.api_key_env = api_key_env
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.max_concurrency = max_concurrency
        # The semaphore caps the requests in flight; the pool holds as many connections, so a
        # request never waits for one (and the time-out is the server's, not the pool's).
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._http = httpx.Client(base_url=self.root, timeout=timeout_s, headers={"Accept": "application/json"},
                                  limits=httpx.Limits(max_connections=max_concurrency,
                                                      max_keepalive_connections=max_concurrency))
        self._lock = threading.Lock()
        self.usage = Usage()

    def __repr__(self) -> str:
        return (f"CompletionsClient({self.root!r}, api_key_env={self.api_key_env!r}, timeout_s={self.timeout_s}, "
                f"max_retries={self.max_retries}, max_concurrency={self.max_concurrency})")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "CompletionsClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _auth(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def count(self, phase: str, **amounts) -> None:
        """Add ``amounts`` to the usage of ``phase`` (thread-safe)."""
        with self._lock:
            usage = self.usage.phases[phase]
            for name, value in amounts.items():
                setattr(usage, name, getattr(usage, name) + value)

    def request(self, method: str, path: str, body: dict | None = None, *, phase: str = "checks") -> dict:
        """The JSON answer of ``method path``; retried as the module docstring says (tenacity)."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            retry=tenacity.retry_if_exception_type(_Transient),
            wait=self._wait, before_sleep=lambda _state: self.count(phase, retries=1), reraise=True)
        try:
            answer = retrying(self._attempt, method, path, body)
        except _Transient as failed:
            raise ApiUnavailable(
                f"{method} {self.root + path}: {failed}, after {self.max_retries + 1} attempt(s). Is the server "
                f"running and reachable at {self.root}? (time-out {self.timeout_s} s per request)") from None
        self.count(phase, requests=1)
        return answer

    def _attempt(self, method: str, path: str, body: dict | None) -> dict:
        """One request: its JSON answer, ApiRequestError when the server rejected it, or
        _Transient when another attempt may succeed."""
        try:
            with self._slots:
                response = self._http.request(method, path, json=body, headers=self._auth())
        except httpx.TransportError as err:  # refused, reset, timed out: nothing answered
            raise _Transient(f"no answer ({type(err).__name__}: {err})") from err
        url = self.root + path
        if response.is_success:
            try:
                return response.json()
            except ValueError:
                raise ApiRequestError(f"{method} {url} answered HTTP {response.status_code} with something "
                                      f"other than JSON: {response.text[:200]!r}", response.status_code) from None
        status, message = response.status_code, _error_message(response)
        if not _is_transient(status, message):
            raise ApiRequestError(f"{method} {url} was rejected with HTTP {status}: {message or '(no message)'}",
                                  status)
        raise _Transient(f"HTTP {status} {message or ''}".strip(), _retry_after(response.headers.get("Retry-After")))

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """The server's Retry-After, else exponential backoff (capped) with jitter in [0.5, 1)."""
        retry_after = state.outcome.exception().retry_after
        if retry_after is not None:
            return retry_after
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (state.attempt_number - 1))
        return delay * (0.5 + random.random() / 2)

    def post(self, path: str, body: dict, *, phase: str = "checks") -> dict:
        return self.request("POST", path, body, phase=phase)

    def get(self, path: str, *, phase: str = "checks") -> dict:
        return self.request("GET", path, phase=phase)


def _error_message(response: httpx.Response) -> str:
    """What a failed answer says: its JSON error message, its text, or for a redirect (which
    is not followed: the key would travel on) where it points."""
    if response.is_redirect:
        return f"it redirects to {response.headers.get('Location')!r}: use that address"
    raw = response.text
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw.strip()[:500] if raw.strip() != "Internal Server Error" else ""
    error = payload.get("error", payload.get("detail", "")) if isinstance(payload, dict) else payload
    message = error.get("message", "") if isinstance(error, dict) else error
    return str(message or "").strip()[:1000]


def _is_transient(status: int, message: str) -> bool:
    """Worth retrying: overload, rate limits, gateways; a 500 only without a message (with one,
    it is llama-cpp-python rejecting the request, which a retry would not change)."""
    return status in RETRY_STATUSES or (status == 500 and not message)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
