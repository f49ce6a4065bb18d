"""The OpenAI-compatible request bodies (validated at the boundary) and response documents."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    # strict: "max_tokens": "7" is a type error (400), not silently 7.
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False
    """vLLM's extension: generate exactly max_tokens (load tests with fixed output lengths)."""
    timeout: float | None = Field(default=None, gt=0.0)
    """Extension: this request's deadline in seconds (at most the server's --request-timeout)."""

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    echo: bool = Field(default=False, description="not supported: must be false")
    logprobs: int | None = Field(default=None, le=0)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_doc(
    rid: str, model: str, text: str, reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
        "usage": use,
    }


def chat_doc(
    rid: str, model: str, text: str, reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        ],
        "usage": use,
    }


def chunk_doc(
    chat: bool,
    rid: str,
    model: str,
    created: int,
    text: str | None,
    reason: str | None,
    first: bool,
) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {"content": text} if text is not None else {}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or ""}
        obj = "text_completion"
    choice["logprobs"] = None
    choice["finish_reason"] = reason
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def error_doc(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, which its clients parse into exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
