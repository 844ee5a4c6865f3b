"""What the HTTP black box's tests share: the requests they make and a client with short retries."""
from __future__ import annotations

from plugin_lib.core.api_client import CompletionsClient

K = 20
PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog and then",
           "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"]
TARGETS = ["Ada and I write code.", "it sleeps.", "Blue is a colour."]


def api_client(url, **kwargs) -> CompletionsClient:
    kwargs.setdefault("max_retries", 2)
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 10)
    return CompletionsClient(url, **kwargs)
