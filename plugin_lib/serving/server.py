"""An OpenAI-compatible endpoint for an adapted model (base + Plugin), on FastAPI: its routes;
the requests are handled by ``serving.completions.CompletionService``.

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
API, up to ``max_concurrency`` requests ask it at once. On shutdown (``GracefulServer``), uvicorn
refuses new connections and the requests in flight have a grace period to finish; then they are
stopped (an open stream ends with an error event), and the batch's thread ends.

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

import uvicorn

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .artifact import PluginModel
from .completions import CompletionService, Limits
from .protocol import ChatRequest, CompletionRequest, OpenAIError


def create_app(plugin: PluginModel, *, model_id: str = "plugin", limits: Limits = Limits(),
               api_key: str | None = None, docs: bool = False) -> FastAPI:
    """The FastAPI application serving ``plugin`` as ``model_id``; ``api_key``: the Bearer key
    every ``/v1`` route needs; ``docs``: serve ``/docs`` and ``/openapi.json``. The routes are
    thin: ``completions.CompletionService`` handles the requests."""
    shown = {} if docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    service = CompletionService(plugin, model_id, limits)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        service.loop = asyncio.get_running_loop()
        yield
        service.close()  # uvicorn has let the requests in flight finish (or stopped them) and refused new ones

    app = FastAPI(title="plugin-repro", description=f"A base adapted by a Plugin: {plugin!r}", lifespan=lifespan,
                  **shown)
    app.state.plugin, app.state.gate, app.state.limits = plugin, service.gate, limits
    app.state.metrics, app.state.engine, app.state.service = service.metrics, service.engine, service
    _guard(app, service, f"Bearer {api_key}".encode() if api_key else None)

    @app.get("/v1/models")
    async def list_models():
        return service.models()

    @app.get("/health")
    async def health():
        return {"status": "ok", "decoding_or_queued": service.gate.admitted, "decoding": service.gate.decoding}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(service.metrics.exposition(), media_type=service.metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        return _streamed(await service.answer(request, raw, service.completion_prompts(request.prompt), chat=False))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest, raw: Request):
        return _streamed(await service.answer(request, raw, [service.chat_prompt(request.messages)], chat=True))

    return app


class GracefulServer(uvicorn.Server):
    """uvicorn's server for ``create_app``'s app: on SIGTERM or Ctrl-C it refuses new connections
    and gives the requests in flight ``grace_s`` seconds to finish; then it stops them
    (``CompletionService.stop_all``: open streams end with an error event, the others get 503), so
    it exits within seconds whatever the clients do. uvicorn's own timeout backs it."""

    def __init__(self, app: FastAPI, *, host: str, port: int, grace_s: float = 5.0, **options):
        super().__init__(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=int(grace_s) + 10,
                                        **options))
        self.service, self.grace_s, self._stopping = app.state.service, grace_s, False

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        loop = self.service.loop
        if not self._stopping and loop is not None:
            self._stopping = True
            loop.call_soon_threadsafe(loop.call_later, self.grace_s, self.service.stop_all)


def _streamed(answer):
    """A stream's events as server-sent events; any other answer as it is."""
    if isinstance(answer, (dict, Response)):
        return answer
    return StreamingResponse(answer, media_type="text/event-stream")


def _guard(app: FastAPI, service: CompletionService, expected: bytes | None) -> None:
    """The key on every ``/v1`` route (compared in constant time), the request count, and errors
    in OpenAI's format."""
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
        service.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
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


