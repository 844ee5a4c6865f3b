"""An OpenAI-compatible endpoint for an adapted model (base + Plugin), on FastAPI.

``create_app(plugin, model_id=..., limits=...)`` serves

- ``POST /v1/completions``: the prompt is shown to the base as the Plugin was trained
  (``DecodingSettings.prompt_format``); a list of prompts gives one choice each;
- ``POST /v1/chat/completions``: the messages through the tokenizer's chat template;
- ``GET /v1/models``;

with ``stream: true`` as server-sent events in OpenAI's chunk format. ``temperature`` 0 (or the
artifact's default) decodes greedily; otherwise ``temperature`` and ``top_p`` sample. ``stop``
cuts the text at the first stop string.

Decoding: with a base in this process, the admitted requests decode together in one batch
(``batching.BatchEngine``: they join and leave at token boundaries, each with its own KV caches,
sampling settings and stop; greedy outputs equal single-request decoding); with a base behind an
API, up to ``max_concurrency`` requests ask it at once. On shutdown, uvicorn refuses new
connections and lets the requests in flight finish; then the batch's thread ends.

Bounds: at most ``max_concurrency`` requests decode at once and ``max_queue`` wait; the next one
gets 503 at once. A request counts until its decoding has stopped: a client that disconnects
(a dropped stream, a closed connection) stops its decoding within one token (``RequestCancelled``
from the streamer) and frees its place then. ``max_tokens`` and the prompt's length are capped
(400 beyond). Errors use OpenAI's format ``{"error": {"message", "type", "param", "code"}}``: 400
for bad parameters, 401 for a missing or wrong key, 404 for an unknown model, 502 when the
upstream base fails (its message, never its key), 503 when the queue is full. A failure in the
middle of a stream ends it with an ``error`` event.

With ``api_key``, every ``/v1`` route needs ``Authorization: Bearer <key>`` (compared in
constant time). ``GET /metrics`` is in Prometheus' format (``serving.metrics``), ``GET /health``
a summary; the interactive docs (``/docs``, ``/openapi.json``) are served only with ``docs=True``.
Usage comes with every answer, and in a stream's last chunk with ``stream_options.include_usage``.
Chat ``content`` is a string or a list of text parts.

The base runs in process or upstream behind another OpenAI-compatible server (an artifact whose
base is an endpoint); the upstream key is read by ``core.api.CompletionsClient`` from its
environment variable at each request and is never logged.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from transformers import TextStreamer
from transformers.generation.streamers import BaseStreamer

from ..core.api import ApiBlackBox, ApiError
from .artifact import Completion, PluginModel, PromptTooLong
from .batching import BatchEngine, Request as EngineRequest
from .inputs import MAX_PROMPT_TOKENS
from .metrics import ServerMetrics
from .protocol import UNSUPPORTED, ChatRequest, CompletionRequest, OpenAIError, Sampling


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 1
    max_queue: int = 16
    max_tokens: int = 512
    max_prompt_tokens: int = MAX_PROMPT_TOKENS


class Gate:
    """Admission: ``admit`` refuses (503) beyond ``max_concurrency + max_queue`` requests, and
    ``running`` holds one of ``max_concurrency`` decoding slots. Runs on the event loop only."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.admitted = 0
        self.decoding = 0
        self._slots: asyncio.Semaphore | None = None

    def admit(self) -> None:
        capacity = self.limits.max_concurrency + self.limits.max_queue
        if self.admitted >= capacity:
            raise OpenAIError(503, f"The server is busy: {self.admitted} requests are decoding or queued (at most "
                                   f"{capacity}). Retry later.", "server_busy", code="queue_full")
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    def running(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.max_concurrency)
        return self._slots


class StopScanner:
    """Text released as it streams, cut at the first stop string; text that could still turn
    out to begin a stop string is held back until it is known not to."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        cuts = [self.pending.find(s) for s in self.stops if s in self.pending]
        if cuts:
            self.stopped = True
            out, self.pending = self.pending[: min(cuts)], ""
            return out
        keep = len(self.pending) - self.hold if self.hold else len(self.pending)
        out, self.pending = self.pending[:max(keep, 0)], self.pending[max(keep, 0):]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


class RequestCancelled(Exception):
    """The client went away: its decoding stopped at the next token."""


class CancelWatch(BaseStreamer):
    """A streamer that only watches ``cancel``: generation calls ``put`` at every token (in
    process and over an API alike), so a set event stops it within one token."""

    def __init__(self, cancel: threading.Event):
        self.cancel = cancel

    def put(self, value) -> None:
        if self.cancel.is_set():
            raise RequestCancelled()

    def end(self) -> None:
        pass


class QueueStreamer(TextStreamer):
    """transformers' text streamer that hands each finished piece of text to an asyncio queue
    (None at the end), so the event loop awaits text without a thread blocked on it; a set
    ``cancel`` stops generation at the next token."""

    def __init__(self, tokenizer, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.loop, self.queue, self.cancel = loop, asyncio.Queue(), cancel

    def put(self, value) -> None:
        if self.cancel.is_set():
            raise RequestCancelled()
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False):
        if text:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, text)
        if stream_end:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


def create_app(plugin: PluginModel, *, model_id: str = "plugin", limits: Limits = Limits(),
               api_key: str | None = None, docs: bool = False) -> FastAPI:
    """The FastAPI application serving ``plugin`` as ``model_id``; ``api_key``: the Bearer key
    every ``/v1`` route needs; ``docs``: serve ``/docs`` and ``/openapi.json``."""
    shown = {} if docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    # A base in this process decodes every admitted request in one batch (``batching``); a base
    # behind an API is asked by up to ``max_concurrency`` threads at once, its client's bound.
    engine = None if isinstance(plugin.base, ApiBlackBox) else BatchEngine(
        plugin.base, plugin.decoder, eos_token_id=plugin.base.eos_token_id,
        repetition_penalty=plugin.decoding.repetition_penalty, max_batch=limits.max_concurrency)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        if engine is not None:  # uvicorn has let the requests in flight finish and refused new ones
            engine.close()

    app = FastAPI(title="plugin-repro", description=f"A base adapted by a Plugin: {plugin!r}", lifespan=lifespan,
                  **shown)
    gate = Gate(limits)
    metrics = ServerMetrics(lambda: gate.admitted, lambda: gate.decoding)
    # Decoding runs on threads of its own, one per slot: the event loop keeps answering.
    workers = ThreadPoolExecutor(limits.max_concurrency, thread_name_prefix="decode")
    created = int(time.time())
    expected = f"Bearer {api_key}".encode() if api_key else None
    app.state.plugin, app.state.gate, app.state.limits, app.state.metrics = plugin, gate, limits, metrics
    app.state.engine = engine

    @app.middleware("http")
    async def key_and_count(request: Request, call_next):
        if not request.url.path.startswith("/v1/"):
            return await call_next(request)
        given = request.headers.get("authorization", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            response = JSONResponse(OpenAIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer "
                                                     "<key>' (the server's --api-key).", code="invalid_api_key").body(),
                                    status_code=401)
        else:
            response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    @app.exception_handler(OpenAIError)
    async def openai_error(_request: Request, err: OpenAIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":  # its location is a character offset, not a parameter
            return JSONResponse(OpenAIError(400, f"The request body is not valid JSON: {first.get('msg', '')} "
                                                 f"(at character {first.get('loc', ('', '?'))[-1]}).",
                                            code="invalid_json").body(), status_code=400)
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(OpenAIError(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", param=where,
                                        code="invalid_value").body(), status_code=400)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "plugin-repro"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "decoding_or_queued": gate.admitted, "decoding": gate.decoding}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.exposition(), media_type=metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt)
        if not prompts:
            raise OpenAIError(400, "prompt is empty.", param="prompt")
        texts = [plugin.format_prompt(p) for p in prompts]
        return await _answer(request, raw, texts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest, raw: Request):
        if plugin.tokenizer.chat_template is None:
            raise OpenAIError(400, "This base's tokenizer has no chat template: use /v1/completions.", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        text = plugin.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return await _answer(request, raw, [text], chat=True)

    async def _answer(request: Sampling, raw: Request, texts: list[str], *, chat: bool):
        settings = _check(request, texts)
        if request.stream and len(texts) != 1:
            raise OpenAIError(400, "stream: true takes a single prompt.", param="prompt")
        gate.admit()
        if request.stream:
            body = _stream(request, raw, texts[0], settings, chat)
            await body.__anext__()  # admitted and decoding before the response starts
            return StreamingResponse(body, media_type="text/event-stream")
        started, cancel = time.perf_counter(), threading.Event()
        watcher = asyncio.create_task(_watch(raw, cancel))
        try:
            async with _slot():
                # a list of prompts decodes together: in the batch, or on the worker threads
                done = list(await asyncio.gather(*(_decode(text, settings, None, cancel) for text in texts)))
        except RequestCancelled:
            metrics.cancelled.inc()
            return Response(status_code=499)  # nobody reads it: the client has gone
        finally:
            watcher.cancel()
            gate.leave()
        metrics.latency.labels(raw.url.path).observe(time.perf_counter() - started)
        usage = _usage(done)
        metrics.tokens(usage["prompt_tokens"], usage["completion_tokens"])
        return _response(request, done, chat)

    async def _watch(raw: Request, cancel: threading.Event) -> None:
        """Set ``cancel`` when the client disconnects (a non-streaming request's handler is not
        cancelled by Starlette, so it asks)."""
        while not await raw.is_disconnected():
            await asyncio.sleep(0.05)
        cancel.set()

    class _slot:
        """One of the decoding slots, held by the request until its decoding has stopped."""

        async def __aenter__(self):
            await gate.running().acquire()
            gate.decoding += 1

        async def __aexit__(self, *exc):
            gate.decoding -= 1
            gate.running().release()

    def _check(request: Sampling, texts: list[str]) -> dict:
        if request.model is not None and request.model != model_id:
            raise OpenAIError(404, f"The model {request.model!r} does not exist here; this server serves {model_id!r}.",
                              param="model", code="model_not_found")
        extra = request.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in extra and extra[name] not in neutral:
                raise OpenAIError(400, f"{name} is not supported by this server.", param=name, code="unsupported_parameter")
        max_tokens = request.max_completion_tokens or request.max_tokens or plugin.decoding.max_new_tokens
        if max_tokens > limits.max_tokens:
            raise OpenAIError(400, f"max_tokens is {max_tokens}; this server allows at most {limits.max_tokens}.",
                              param="max_tokens", code="invalid_value")
        try:  # the one policy of generate, evaluate and serve: used whole or refused
            plugin.check_prompt_lengths(texts, limits.max_prompt_tokens)
        except PromptTooLong as err:
            raise OpenAIError(400, str(err), param="prompt", code="context_length_exceeded") from None
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        if request.min_tokens > max_tokens:
            raise OpenAIError(400, f"min_tokens ({request.min_tokens}) exceeds max_tokens ({max_tokens}).",
                              param="min_tokens", code="invalid_value")
        return {"max_new_tokens": max_tokens, "temperature": request.temperature, "top_p": request.top_p,
                "seed": request.seed, "stops": stops, "min_new_tokens": request.min_tokens}

    def _decode(text: str, settings: dict, streamer, cancel: threading.Event) -> asyncio.Future:
        """The completion of ``text``: in the batch (a base in process) or on a worker thread."""
        if engine is None:
            return asyncio.get_running_loop().run_in_executor(workers, _complete, text, settings,
                                                              streamer or CancelWatch(cancel))
        return asyncio.ensure_future(_batched(text, settings, streamer, cancel))

    async def _batched(text: str, settings: dict, streamer, cancel: threading.Event) -> Completion:
        ids = plugin.tokenizer(text, add_special_tokens=False).input_ids
        d = plugin.decoding
        request = EngineRequest(ids, settings["max_new_tokens"],
                                temperature=d.temperature if settings["temperature"] is None else settings["temperature"],
                                top_p=d.top_p if settings["top_p"] is None else settings["top_p"], seed=settings["seed"],
                                streamer=streamer, cancel=cancel, min_new_tokens=settings["min_new_tokens"])
        generated, reason = await asyncio.wrap_future(engine.submit(request))
        if reason == "cancelled":
            raise RequestCancelled()
        done = Completion(plugin.tokenizer.decode(generated, skip_special_tokens=True), len(ids), len(generated), reason)
        return _cut(done, settings)

    def _complete(text: str, settings: dict, streamer=None) -> Completion:
        try:
            done = plugin.complete(text, max_new_tokens=settings["max_new_tokens"], temperature=settings["temperature"],
                                   top_p=settings["top_p"], seed=settings["seed"], streamer=streamer,
                                   min_new_tokens=settings["min_new_tokens"])
        except ApiError as err:
            raise OpenAIError(502, f"The upstream base failed: {err}", "upstream_error", code="upstream_failed") from None
        return _cut(done, settings)

    def _cut(done: Completion, settings: dict) -> Completion:
        scanner = StopScanner(settings["stops"])
        cut = scanner.feed(done.text) + scanner.flush()
        if scanner.stopped:
            done = Completion(cut, done.prompt_tokens, done.completion_tokens, "stop")
        return done

    async def _stream(request: Sampling, raw: Request, text: str, settings: dict, chat: bool
                      ) -> AsyncIterator[str]:
        """The stream's events. Its first item, "", is taken by ``_answer`` once the request holds
        a slot and decodes; from then on a disconnect (Starlette cancels this generator, or
        ``_watch`` sees it) stops the decoding at the next token, and the request's place is
        freed when the decoding thread has stopped."""
        ident, kind = _ident(chat), "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((request.stream_options or {}).get("include_usage"))

        def chunk(piece: str | None, finish: str | None = None) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if piece is None and finish is None else (
                    {"content": piece} if piece is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
            payload = {"id": ident, "object": kind, "created": int(time.time()), "model": model_id, "choices": [choice]}
            return _event({**payload, "usage": None} if include_usage else payload)

        started, cancel = time.perf_counter(), threading.Event()
        watcher = asyncio.create_task(_watch(raw, cancel))
        slot, held, work = _slot(), False, None
        try:
            await slot.__aenter__()
            held = True
            loop = asyncio.get_running_loop()
            streamer = QueueStreamer(plugin.tokenizer, loop, cancel)
            scanner = StopScanner(settings["stops"])
            work = (loop.run_in_executor(workers, _run_streaming, text, settings, streamer) if engine is None
                    else _decode(text, settings, streamer, cancel))
            yield ""  # primed: admitted, decoding
            if chat:
                yield chunk(None)
            first = True
            while True:
                piece = await streamer.queue.get()
                if piece is None:
                    break
                released = scanner.feed(piece)
                if released:
                    if first:
                        metrics.first_token.observe(time.perf_counter() - started)
                        first = False
                    yield chunk(released)
            tail = scanner.flush()
            if tail:
                yield chunk(tail)
            try:
                done = await work
            except RequestCancelled:
                metrics.cancelled.inc()
                return
            except OpenAIError as err:
                yield _event(err.body())
                return
            yield chunk(None, "stop" if scanner.stopped else done.finish_reason)
            if include_usage:
                yield _event({"id": ident, "object": kind, "created": int(time.time()), "model": model_id,
                              "choices": [], "usage": _usage([done])})
            metrics.tokens(done.prompt_tokens, done.completion_tokens)
            metrics.latency.labels(raw.url.path).observe(time.perf_counter() - started)
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            metrics.cancelled.inc()
            raise
        finally:
            watcher.cancel()
            cancel.set()  # after the end a no-op; after a drop, decoding stops at the next token

            def release(*_) -> None:
                if work is not None and work.done() and not work.cancelled():
                    work.exception()  # retrieved: a cancelled decoding's RequestCancelled is expected
                if held:
                    gate.decoding -= 1
                    gate.running().release()
                gate.leave()

            if work is not None and not work.done():
                work.add_done_callback(release)  # its place stays taken until the thread has stopped
            else:
                release()

    def _run_streaming(text: str, settings: dict, streamer: QueueStreamer) -> Completion:
        try:
            return _complete(text, settings, streamer)
        finally:
            streamer.end()  # the reader stops even when generation failed

    def _response(request: Sampling, done: list[Completion], chat: bool) -> dict:
        usage = _usage(done)
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": d.text}, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        else:
            choices = [{"index": i, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        return {"id": _ident(chat), "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_id, "choices": choices, "usage": usage}

    return app


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for serving an address other machines can reach without a key, or None."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume the network can reach it
        loopback = False
    if loopback or api_key:
        return None
    return (f"WARNING: serving {host}, which other machines can reach, without a key: anyone who can connect can "
            "use this model. Set --api-key (or PLUGIN_API_KEY), or serve 127.0.0.1.")


def _usage(done: list[Completion]) -> dict:
    prompt, completion = sum(d.prompt_tokens for d in done), sum(d.completion_tokens for d in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
