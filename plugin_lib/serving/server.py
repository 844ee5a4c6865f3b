"""An OpenAI-compatible endpoint for an adapted model (base + Plugin), on FastAPI.

``create_app(plugin, model_id=..., limits=...)`` serves

- ``POST /v1/completions``: the prompt is shown to the base as the Plugin was trained
  (``DecodingSettings.prompt_format``); a list of prompts gives one choice each;
- ``POST /v1/chat/completions``: the messages through the tokenizer's chat template;
- ``GET /v1/models``;

with ``stream: true`` as server-sent events in OpenAI's chunk format. ``temperature`` 0 (or the
artifact's default) decodes greedily; otherwise ``temperature`` and ``top_p`` sample. ``stop``
cuts the text at the first stop string.

Bounds: at most ``max_concurrency`` requests decode at once and ``max_queue`` wait; the next one
gets 503 at once. ``max_tokens`` and the prompt's length are capped (400 beyond). Errors use
OpenAI's format ``{"error": {"message", "type", "param", "code"}}``: 400 for bad parameters,
404 for an unknown model, 502 when the upstream base fails (its message, never its key), 503 when
the queue is full. A failure in the middle of a stream ends it with an ``error`` event.

The base runs in process or upstream behind another OpenAI-compatible server (an artifact whose
base is an endpoint); the upstream key is read by ``core.api.CompletionsClient`` from its
environment variable at each request and is never logged.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from transformers import TextStreamer

from ..core.api import ApiError
from .artifact import Completion, PluginModel

# Parameters of OpenAI's API this server does not implement: a request that sets one to
# something other than its neutral value is refused rather than silently answered otherwise.
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
               "suffix": (None, ""), "tools": (None, []), "functions": (None, []), "response_format": (None,)}


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 1
    max_queue: int = 16
    max_tokens: int = 512
    max_prompt_tokens: int = 2048


class OpenAIError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", *, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class Gate:
    """Admission: ``admit`` refuses (503) beyond ``max_concurrency + max_queue`` requests, and
    ``running`` holds one of ``max_concurrency`` decoding slots. Runs on the event loop only."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.admitted = 0
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


class QueueStreamer(TextStreamer):
    """transformers' text streamer that hands each finished piece of text to an asyncio queue
    (None at the end), so the event loop awaits text without a thread blocked on it."""

    def __init__(self, tokenizer, loop: asyncio.AbstractEventLoop):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.loop, self.queue = loop, asyncio.Queue()

    def on_finalized_text(self, text: str, stream_end: bool = False):
        if text:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, text)
        if stream_end:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


def create_app(plugin: PluginModel, *, model_id: str = "plugin", limits: Limits = Limits()) -> FastAPI:
    """The FastAPI application serving ``plugin`` as ``model_id``."""
    app = FastAPI(title="plugin-repro", description=f"A base adapted by a Plugin: {plugin!r}")
    gate = Gate(limits)
    # Decoding runs on threads of its own, one per slot: the event loop keeps answering.
    workers = ThreadPoolExecutor(limits.max_concurrency, thread_name_prefix="decode")
    created = int(time.time())
    app.state.plugin, app.state.gate, app.state.limits = plugin, gate, limits

    @app.exception_handler(OpenAIError)
    async def openai_error(_request: Request, err: OpenAIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(OpenAIError(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", param=where,
                                        code="invalid_value").body(), status_code=400)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "plugin-repro"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "decoding_or_queued": gate.admitted}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt)
        if not prompts:
            raise OpenAIError(400, "prompt is empty.", param="prompt")
        texts = [plugin.format_prompt(p) for p in prompts]
        return await _answer(request, texts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest):
        if plugin.tokenizer.chat_template is None:
            raise OpenAIError(400, "This base's tokenizer has no chat template: use /v1/completions.", param="messages")
        messages = [m.model_dump() for m in request.messages]
        text = plugin.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return await _answer(request, [text], chat=True)

    async def _answer(request: _Sampling, texts: list[str], *, chat: bool):
        settings = _check(request, texts)
        if request.stream and len(texts) != 1:
            raise OpenAIError(400, "stream: true takes a single prompt.", param="prompt")
        gate.admit()
        if request.stream:
            return StreamingResponse(_stream(request, texts[0], settings, chat), media_type="text/event-stream")
        try:
            async with gate.running():
                loop = asyncio.get_running_loop()
                done = [await loop.run_in_executor(workers, _complete, text, settings) for text in texts]
        finally:
            gate.leave()
        return _response(request, done, chat)

    def _check(request: _Sampling, texts: list[str]) -> dict:
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
        for text in texts:
            length = len(plugin.tokenizer(text, add_special_tokens=False).input_ids)
            if length > limits.max_prompt_tokens:
                raise OpenAIError(400, f"The prompt has {length} tokens; this server accepts at most "
                                       f"{limits.max_prompt_tokens}.", param="prompt", code="context_length_exceeded")
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        return {"max_new_tokens": max_tokens, "temperature": request.temperature, "top_p": request.top_p,
                "seed": request.seed, "stops": stops}

    def _complete(text: str, settings: dict, streamer=None) -> Completion:
        try:
            done = plugin.complete(text, max_new_tokens=settings["max_new_tokens"], temperature=settings["temperature"],
                                   top_p=settings["top_p"], seed=settings["seed"], streamer=streamer)
        except ApiError as err:
            raise OpenAIError(502, f"The upstream base failed: {err}", "upstream_error", code="upstream_failed") from None
        scanner = StopScanner(settings["stops"])
        cut = scanner.feed(done.text) + scanner.flush()
        if scanner.stopped:
            done = Completion(cut, done.prompt_tokens, done.completion_tokens, "stop")
        return done

    async def _stream(request: _Sampling, text: str, settings: dict, chat: bool) -> AsyncIterator[str]:
        ident, kind = _ident(chat), "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece: str | None, finish: str | None = None) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if piece is None and finish is None else (
                    {"content": piece} if piece is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
            return _event({"id": ident, "object": kind, "created": int(time.time()), "model": model_id,
                           "choices": [choice]})

        try:
            async with gate.running():
                loop = asyncio.get_running_loop()
                streamer = QueueStreamer(plugin.tokenizer, loop)
                scanner = StopScanner(settings["stops"])
                work = loop.run_in_executor(workers, _run_streaming, text, settings, streamer)
                if chat:
                    yield chunk(None)
                while True:
                    piece = await streamer.queue.get()
                    if piece is None:
                        break
                    released = scanner.feed(piece)
                    if released:
                        yield chunk(released)
                tail = scanner.flush()
                if tail:
                    yield chunk(tail)
                try:
                    done = await work
                except OpenAIError as err:
                    yield _event(err.body())
                    return
                yield chunk(None, "stop" if scanner.stopped else done.finish_reason)
                yield "data: [DONE]\n\n"
        finally:
            gate.leave()

    def _run_streaming(text: str, settings: dict, streamer: QueueStreamer) -> Completion:
        try:
            return _complete(text, settings, streamer)
        finally:
            streamer.end()  # the reader stops even when generation failed

    def _response(request: _Sampling, done: list[Completion], chat: bool) -> dict:
        usage = {"prompt_tokens": sum(d.prompt_tokens for d in done),
                 "completion_tokens": sum(d.completion_tokens for d in done)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": d.text}, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        else:
            choices = [{"index": i, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
                       for i, d in enumerate(done)]
        return {"id": _ident(chat), "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_id, "choices": choices, "usage": usage}

    return app


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
