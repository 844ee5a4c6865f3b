"""A fake OpenAI-compatible completions server in a thread, serving an in-process base, for the
HTTP black box's tests (tests/test_api.py): ``fake(**options)`` starts one (the fixture), closed
after the test."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import torch.nn.functional as F


class FakeServer(ThreadingHTTPServer):
    """An OpenAI-compatible completions server in a thread, backed by an in-process black box.

    It tokenizes the text prompt, runs the base, and answers with top-k keys in vLLM's exact
    ``token_id:<id>`` style and OpenAI's echo alignment; without echo it continues greedily
    over ``max_tokens`` positions (``logit_bias`` applied to its choice, as a server does).
    ``script`` is a list of (status, body, headers) answered first, whatever the request;
    ``cap_k`` returns at most that many log-probabilities; ``no_logprobs`` leaves them out;
    ``delay`` waits per request. HTTP/1.1 keep-alive, so a client can reuse its connection.
    """

    daemon_threads = True

    def __init__(self, base, tokenizer, *, script=(), cap_k=None, no_logprobs=False, delay=0.0,
                 tokenize=None, completions=True):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.base, self.tokenizer = base, tokenizer
        self.script, self.cap_k, self.no_logprobs, self.delay = list(script), cap_k, no_logprobs, delay
        self.tokenize = tokenize or (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
        self.completions = completions
        self.requests, self.headers_seen, self.client_ports, self.bodies = 0, [], [], []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()

    def top(self, row: torch.Tensor, k: int) -> dict[str, float]:
        values, ids = row.topk(min(k, self.cap_k or k))
        return {f"token_id:{i}": float(v) for v, i in zip(values.tolist(), ids.tolist())}

    def next_log_probs(self, ids: list[int]) -> torch.Tensor:
        """Row j: the distribution after ids[:j+1]."""
        return F.log_softmax(self.base.logits(torch.tensor([ids]))[0].float(), dim=-1)

    def complete(self, body: dict) -> dict:
        ids = self.tokenize(body["prompt"])
        log_p = self.next_log_probs(ids)
        k = body.get("logprobs")
        bias = torch.zeros(log_p.shape[-1])
        for token, value in (body.get("logit_bias") or {}).items():
            bias[int(token)] = value
        steps = 1 if body.get("echo") else body.get("max_tokens", 1)
        generated, rows = [], []
        for _ in range(steps):
            row = log_p[-1] if not generated else self.next_log_probs(ids + generated)[-1]
            rows.append(row)
            generated.append(int((row + bias).argmax()))
        choice = {"text": self.tokenizer.decode(generated), "index": 0, "finish_reason": "length", "logprobs": None}
        if k is not None and not self.no_logprobs:
            if body.get("echo"):
                # OpenAI: entry i is token i with the distribution it was drawn from; entry 0 null.
                tops = [None] + [self.top(log_p[i - 1], k) for i in range(1, len(ids))] + [self.top(log_p[-1], k)]
                tokens = [f"token_id:{i}" for i in ids + generated]
            else:
                tops, tokens = [self.top(row, k) for row in rows], [f"token_id:{i}" for i in generated]
            choice["logprobs"] = {"tokens": tokens, "top_logprobs": tops}
        return {"choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated)}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every answer carries its Content-Length

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body, headers=()):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, body: dict | None):
        server: FakeServer = self.server
        with server.lock:
            server.requests += 1
            server.headers_seen.append(dict(self.headers))
            server.client_ports.append(self.client_address[1])
            server.bodies.append(body)
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
            scripted = server.script.pop(0) if server.script else None
        try:
            time.sleep(server.delay)
            if scripted is not None:
                reply = scripted
            elif self.path == "/v1/models":
                reply = (200, {"data": [{"id": "fake"}]})
            elif self.path == "/extras/tokenize":
                reply = (200, {"tokens": server.tokenize(body["input"])})
            elif self.path == "/v1/completions" and server.completions:
                reply = (200, server.complete(body))
            else:
                reply = (404, {"detail": "Not Found"})
        finally:
            # Out of flight before the reply is written: a client that has the reply may send
            # its next request at once, and that one must not overlap this one in the count.
            with server.lock:
                server.in_flight -= 1
        return self._answer(*reply)

    def do_GET(self):
        self._serve(None)

    def do_POST(self):
        self._serve(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))


@pytest.fixture
def fake(tiny_base):
    servers = []

    def start(**kwargs):
        server = FakeServer(tiny_base, tiny_base.tokenizer, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
