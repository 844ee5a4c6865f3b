"""What the endpoint accepts and how it refuses: the request bodies of OpenAI's completions and
chat completions (pydantic), the parameters it does not implement, and errors in OpenAI's format
(``{"error": {"message", "type", "param", "code"}}``). ``serving.server`` answers them."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Parameters of OpenAI's API this server does not implement: a request that sets one to
# something other than its neutral value is refused rather than silently answered otherwise.
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
               "suffix": (None, ""), "tools": (None, []), "functions": (None, []), "response_format": (None,)}


class OpenAIError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", *, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class Sampling(BaseModel):
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
    stream_options: dict[str, Any] | None = None
    min_tokens: int = Field(0, ge=0)  # vLLM's extension: no end of sequence before this many tokens


class CompletionRequest(Sampling):
    prompt: str | list[str]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]

    def text(self) -> str:
        """The content as one string: text parts joined by newlines (OpenAI's list form)."""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
