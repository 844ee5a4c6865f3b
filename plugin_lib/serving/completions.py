"""Request handling of the OpenAI-compatible endpoint (``serving.server`` holds its routes):
``CompletionService`` checks a request, admits it, decodes it (in the batch of a base in this
process, or on worker threads for a base behind an API), cuts it at its stop strings, streams it,
and answers in OpenAI's format; it is usable, and tested, without building the app (vLLM keeps its
serving classes apart from its routes the same way). ``Limits`` bound it, ``Gate`` admits.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from transformers import TextStreamer
from transformers.generation.streamers import BaseStreamer

from ..core.api import ApiBlackBox
from ..core.api_client import ApiError
from .artifact import Completion, PluginModel, PromptTooLong
from .batching import BatchEngine, Request as EngineRequest
from .inputs import MAX_PROMPT_TOKENS
from .metrics import ServerMetrics
from .protocol import UNSUPPORTED, OpenAIError, Sampling


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 1
    max_queue: int = 16
    max_tokens: int = 512
    max_prompt_tokens: int = MAX_PROMPT_TOKENS


@dataclass(frozen=True)
class CompletionSettings:
    """One request's decoding, checked (``CompletionService.check``), the artifact's defaults
    filled in where it left them out; ``stops``: the texts its output is cut at."""

    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    min_new_tokens: int
    stops: tuple[str, ...]


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

    def __init__(self, stops: Sequence[str]):
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


class CompletionService:
    """Serves ``plugin`` as ``model_id`` within ``limits``: one per app, holding the admission
    gate, the metrics, the batch (a base in process) or the worker threads (a base behind an API)."""

    def __init__(self, plugin: PluginModel, model_id: str = "plugin", limits: Limits = Limits()):
        self.plugin, self.model_id, self.limits = plugin, model_id, limits
        # A base in this process decodes every admitted request in one batch (``batching``); a base
        # behind an API is asked by up to ``max_concurrency`` threads at once, its client's bound.
        self.engine = None if isinstance(plugin.base, ApiBlackBox) else BatchEngine(
            plugin.base, plugin.decoder, eos_token_id=plugin.base.eos_token_id,
            repetition_penalty=plugin.decoding.repetition_penalty, max_batch=limits.max_concurrency)
        self.gate = Gate(limits)
        self.metrics = ServerMetrics(lambda: self.gate.admitted, lambda: self.gate.decoding)
        # Decoding runs on threads of its own, one per slot: the event loop keeps answering.
        self.workers = ThreadPoolExecutor(limits.max_concurrency, thread_name_prefix="decode")
        self.created = int(time.time())
        # Shutdown: each request's cancel event while it is in flight, and whether they were stopped.
        self.in_flight: set[threading.Event] = set()
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, set when it starts

    def stop_all(self) -> None:
        """The end of a shutdown's grace (on the event loop): every request in flight stops at its
        next token; an open stream ends with an error event, any other request gets a 503, and so
        does a queued one when its turn comes."""
        self.closing = True
        for cancel in list(self.in_flight):
            cancel.set()

    @staticmethod
    def shutdown_error() -> OpenAIError:
        return OpenAIError(503, "The server is shutting down: this request was stopped before its end. Retry it.",
                           "server_error", code="server_shutdown")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "plugin-repro"}]}

    def completion_prompts(self, prompt: str | list[str]) -> list[str]:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts:
            raise OpenAIError(400, "prompt is empty.", param="prompt")
        return [self.plugin.format_prompt(p) for p in prompts]

    def chat_prompt(self, messages) -> str:
        if self.plugin.tokenizer.chat_template is None:
            raise OpenAIError(400, "This base's tokenizer has no chat template: use /v1/completions.", param="messages")
        turns = [{"role": m.role, "content": m.text()} for m in messages]
        return self.plugin.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    async def answer(self, request: Sampling, raw: Request, texts: list[str], *, chat: bool):
        """A checked, admitted request's answer: a stream, or the whole response."""
        settings = self.check(request, texts)
        if request.stream and len(texts) != 1:
            raise OpenAIError(400, "stream: true takes a single prompt.", param="prompt")
        self.gate.admit()
        if request.stream:
            body = self.stream(request, raw, texts[0], settings, chat)
            await body.__anext__()  # admitted and decoding before the response starts
            return body
        started, cancel = time.perf_counter(), threading.Event()
        watcher = asyncio.create_task(_watch(raw, cancel))
        self.in_flight.add(cancel)
        try:
            async with _Slot(self.gate):
                if self.closing:
                    raise self.shutdown_error()
                # a list of prompts decodes together: in the batch, or on the worker threads
                done = list(await asyncio.gather(*(self._decode(text, settings, None, cancel) for text in texts)))
        except RequestCancelled:
            self.metrics.cancelled.inc()
            if self.closing:
                raise self.shutdown_error() from None
            return Response(status_code=499)  # nobody reads it: the client has gone
        finally:
            watcher.cancel()
            self.gate.leave()
            self.in_flight.discard(cancel)
        self.metrics.latency.labels(raw.url.path).observe(time.perf_counter() - started)
        usage = _usage(done)
        self.metrics.tokens(usage["prompt_tokens"], usage["completion_tokens"])
        return self.response(done, chat)

    def check(self, request: Sampling, texts: list[str]) -> CompletionSettings:
        """The request's decoding settings; a parameter out of bounds is a 400 (404: another model)."""
        if request.model is not None and request.model != self.model_id:
            raise OpenAIError(404, f"The model {request.model!r} does not exist here; this server serves "
                                   f"{self.model_id!r}.", param="model", code="model_not_found")
        extra = request.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if name in extra and extra[name] not in neutral:
                raise OpenAIError(400, f"{name} is not supported by this server.", param=name, code="unsupported_parameter")
        max_tokens = request.max_completion_tokens or request.max_tokens or self.plugin.decoding.max_new_tokens
        if max_tokens > self.limits.max_tokens:
            raise OpenAIError(400, f"max_tokens is {max_tokens}; this server allows at most {self.limits.max_tokens}.",
                              param="max_tokens", code="invalid_value")
        try:  # the one policy of generate, evaluate and serve: used whole or refused
            self.plugin.check_prompt_lengths(texts, self.limits.max_prompt_tokens)
        except PromptTooLong as err:
            raise OpenAIError(400, str(err), param="prompt", code="context_length_exceeded") from None
        stops = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
        if request.min_tokens > max_tokens:
            raise OpenAIError(400, f"min_tokens ({request.min_tokens}) exceeds max_tokens ({max_tokens}).",
                              param="min_tokens", code="invalid_value")
        d = self.plugin.decoding
        return CompletionSettings(max_new_tokens=max_tokens,
                                  temperature=d.temperature if request.temperature is None else request.temperature,
                                  top_p=d.top_p if request.top_p is None else request.top_p, seed=request.seed,
                                  min_new_tokens=request.min_tokens, stops=stops)

    def _decode(self, text: str, settings: CompletionSettings, streamer, cancel: threading.Event) -> asyncio.Future:
        """The completion of ``text``: in the batch (a base in process) or on a worker thread."""
        if self.engine is None:
            return asyncio.get_running_loop().run_in_executor(self.workers, self._complete, text, settings,
                                                              streamer or CancelWatch(cancel))
        return asyncio.ensure_future(self._batched(text, settings, streamer, cancel))

    async def _batched(self, text: str, settings: CompletionSettings, streamer, cancel: threading.Event
                       ) -> Completion:
        plugin = self.plugin
        ids = plugin.tokenizer(text, add_special_tokens=False).input_ids
        request = EngineRequest(ids, settings.max_new_tokens, temperature=settings.temperature, top_p=settings.top_p,
                                seed=settings.seed, streamer=streamer, cancel=cancel,
                                min_new_tokens=settings.min_new_tokens)
        generated, reason = await asyncio.wrap_future(self.engine.submit(request))
        if reason == "cancelled":
            raise RequestCancelled()
        done = Completion(plugin.tokenizer.decode(generated, skip_special_tokens=True), len(ids), len(generated), reason)
        return _cut(done, settings)

    def _complete(self, text: str, settings: CompletionSettings, streamer=None) -> Completion:
        try:
            done = self.plugin.complete(text, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                        top_p=settings.top_p, seed=settings.seed, streamer=streamer,
                                        min_new_tokens=settings.min_new_tokens)
        except ApiError as err:
            raise OpenAIError(502, f"The upstream base failed: {err}", "upstream_error", code="upstream_failed") from None
        return _cut(done, settings)

    def _run_streaming(self, text: str, settings: CompletionSettings, streamer: QueueStreamer) -> Completion:
        try:
            return self._complete(text, settings, streamer)
        finally:
            streamer.end()  # the reader stops even when generation failed

    def _chunk(self, ident: str, chat: bool, include_usage: bool, piece: str | None, finish: str | None = None) -> str:
        """One event of a stream in OpenAI's chunk format (a chat's first: the assistant's role)."""
        if chat:
            delta = {"role": "assistant", "content": ""} if piece is None and finish is None else (
                {"content": piece} if piece is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        payload = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": int(time.time()), "model": self.model_id, "choices": [choice]}
        return _event({**payload, "usage": None} if include_usage else payload)

    async def stream(self, request: Sampling, raw: Request, text: str, settings: CompletionSettings, chat: bool
                     ) -> AsyncIterator[str]:
        """The stream's events. Its first item, "", is taken by ``answer`` once the request holds
        a slot and decodes; from then on a disconnect (Starlette cancels this generator, or
        ``_watch`` sees it) stops the decoding at the next token, and the request's place is
        freed when the decoding thread has stopped."""
        ident, include_usage = _ident(chat), bool((request.stream_options or {}).get("include_usage"))
        started, cancel = time.perf_counter(), threading.Event()
        watcher = asyncio.create_task(_watch(raw, cancel))
        slot, held, work = _Slot(self.gate), False, None
        self.in_flight.add(cancel)
        try:
            await slot.__aenter__()
            held = True
            if self.closing:  # queued until the shutdown stopped the others: a 503 (not yet streaming)
                raise self.shutdown_error()
            loop = asyncio.get_running_loop()
            streamer = QueueStreamer(self.plugin.tokenizer, loop, cancel)
            work = (loop.run_in_executor(self.workers, self._run_streaming, text, settings, streamer)
                    if self.engine is None else self._decode(text, settings, streamer, cancel))
            yield ""  # primed: admitted, decoding
            async for event in self._events(streamer, work, raw, ident, chat, include_usage, settings, started):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            self.metrics.cancelled.inc()
            raise
        finally:
            watcher.cancel()
            cancel.set()  # after the end a no-op; after a drop, decoding stops at the next token
            self.in_flight.discard(cancel)
            self._release_when_stopped(work, held)

    async def _events(self, streamer: QueueStreamer, work, raw: Request, ident: str, chat: bool, include_usage: bool,
                      settings: CompletionSettings, started: float) -> AsyncIterator[str]:
        """The text as it is decoded, cut at the stop strings, then the end (or the error)."""
        if chat:
            yield self._chunk(ident, chat, include_usage, None)
        scanner, first = StopScanner(settings.stops), True
        while (piece := await streamer.queue.get()) is not None:
            released = scanner.feed(piece)
            if released:
                if first:
                    self.metrics.first_token.observe(time.perf_counter() - started)
                    first = False
                yield self._chunk(ident, chat, include_usage, released)
        tail = scanner.flush()
        if tail:
            yield self._chunk(ident, chat, include_usage, tail)
        try:
            done = await work
        except RequestCancelled:
            self.metrics.cancelled.inc()
            if self.closing:  # the stream is still open: it ends saying why
                yield _event(self.shutdown_error().body())
            return
        except OpenAIError as err:
            yield _event(err.body())
            return
        yield self._chunk(ident, chat, include_usage, None, "stop" if scanner.stopped else done.finish_reason)
        if include_usage:
            yield _event({"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                          "created": int(time.time()), "model": self.model_id, "choices": [], "usage": _usage([done])})
        self.metrics.tokens(done.prompt_tokens, done.completion_tokens)
        self.metrics.latency.labels(raw.url.path).observe(time.perf_counter() - started)
        yield "data: [DONE]\n\n"

    def _release_when_stopped(self, work, held: bool) -> None:
        """The request's slot and place, freed once its decoding has stopped."""
        gate = self.gate

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

    def response(self, done: list[Completion], chat: bool) -> dict:
        usage = _usage(done)
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": d.text}, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        else:
            choices = [{"index": i, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        return {"id": _ident(chat), "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_id, "choices": choices, "usage": usage}


class _Slot:
    """One of the decoding slots, held by the request until its decoding has stopped."""

    def __init__(self, gate: Gate):
        self.gate = gate

    async def __aenter__(self):
        await self.gate.running().acquire()
        self.gate.decoding += 1

    async def __aexit__(self, *exc):
        self.gate.decoding -= 1
        self.gate.running().release()


async def _watch(raw: Request, cancel: threading.Event) -> None:
    """Set ``cancel`` when the client disconnects (a non-streaming request's handler is not
    cancelled by Starlette, so it asks)."""
    while not await raw.is_disconnected():
        await asyncio.sleep(0.05)
    cancel.set()


def _cut(done: Completion, settings: CompletionSettings) -> Completion:
    scanner = StopScanner(settings.stops)
    cut = scanner.feed(done.text) + scanner.flush()
    if scanner.stopped:
        done = Completion(cut, done.prompt_tokens, done.completion_tokens, "stop")
    return done


def _usage(done: list[Completion]) -> dict:
    prompt, completion = sum(d.prompt_tokens for d in done), sum(d.completion_tokens for d in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
