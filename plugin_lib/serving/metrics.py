"""The server's Prometheus metrics (``GET /metrics``, prometheus-client's text format).

One registry per application, so several servers in one process (the tests) keep their counts
apart. Names follow Prometheus' conventions (``_total`` for counters, ``_seconds`` for times):

- ``plugin_requests_total{endpoint, status}``: answered requests, by HTTP status;
- ``plugin_requests_in_flight``: requests decoding or queued (what ``--max-queue`` bounds);
- ``plugin_requests_decoding``: requests holding a decoding slot;
- ``plugin_requests_cancelled_total``: requests whose client went away before the end;
- ``plugin_prompt_tokens_total``, ``plugin_generation_tokens_total``;
- ``plugin_request_seconds{endpoint}``: end to end, a histogram;
- ``plugin_time_to_first_token_seconds``: for streams, a histogram.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class ServerMetrics:
    """The counters of one server; ``in_flight`` and ``decoding`` read the gate when scraped."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, in_flight: Callable[[], float], decoding: Callable[[], float]):
        self.registry = CollectorRegistry()
        kw = {"registry": self.registry}
        self.requests = Counter("plugin_requests", "Requests answered, by endpoint and HTTP status.",
                                ["endpoint", "status"], **kw)
        Gauge("plugin_requests_in_flight", "Requests decoding or queued.", **kw).set_function(in_flight)
        Gauge("plugin_requests_decoding", "Requests holding a decoding slot.", **kw).set_function(decoding)
        self.cancelled = Counter("plugin_requests_cancelled", "Requests whose client disconnected before the end.", **kw)
        self.prompt_tokens = Counter("plugin_prompt_tokens", "Prompt tokens of answered requests.", **kw)
        self.generation_tokens = Counter("plugin_generation_tokens", "Tokens generated for answered requests.", **kw)
        self.latency = Histogram("plugin_request_seconds", "Time from admission to the last token.", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, **kw)
        self.first_token = Histogram("plugin_time_to_first_token_seconds", "Streams: admission to the first text.",
                                     buckets=LATENCY_BUCKETS, **kw)

    def tokens(self, prompt: int, generated: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
