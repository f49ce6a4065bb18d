"""The OpenAI-compatible request bodies (validated at the boundary) and response documents.

Every field OpenAI's API (or vLLM's extension of it) defines is either implemented, accepted
only at its no-op value (`echo=false`, `best_of=1`, `response_format={"type": "text"}`, ...)
with a 400 naming the field otherwise, or refused when present. A field no one defines is a 400
too ("Unrecognized request argument supplied"), as OpenAI answers: nothing is ignored silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalelab.system.generate.sequence import MAX_LOGPROBS

MAX_N = 16
"""Most choices one request may ask for (each is a sequence the engine runs)."""


class FieldError(Exception):
    """A request field this server does not accept (answered 400 with `param` = the field)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    """A last chunk with empty `choices` carries the usage (other chunks: `usage: null`)."""
    continuous_usage_stats: bool = False
    """vLLM's extension: with include_usage, every chunk carries the usage so far."""


class _Sampling(BaseModel):
    # strict: "max_tokens": "7" is a type error (400), not silently 7; forbid: an unknown field
    # is a 400 naming it.
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    """Choices per request: n sequences of one prompt (its KV blocks shared through the
    prefix cache); with a seed, choice i samples with seed + i."""
    user: str | None = None
    """End-user id for abuse tracking: accepted, no effect here."""
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, OpenAI's JSON) -> bias in [-100, 100] added to its logit."""
    ignore_eos: bool = False
    """vLLM's extension: generate exactly max_tokens (load tests with fixed output lengths)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's extension: logprobs name tokens "token_id:<id>" (exact, where text is lossy)."""
    timeout: float | None = Field(default=None, gt=0.0)
    """Extension: this request's deadline in seconds (at most the server's --request-timeout)."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`"temperature": null` means the default, as OpenAI's and vLLM's servers read it
        (several client libraries send every field, unset ones as null)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].default is None}

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def bias(self, vocab_size: int) -> dict[int, float]:
        """logit_bias with int keys, each a token id of this model."""
        out: dict[int, float] = {}
        for k, v in (self.logit_bias or {}).items():
            if not k.isdigit() or int(k) >= vocab_size:
                raise FieldError("logit_bias", f"logit_bias key {k!r} is not a token id in "
                                 f"[0, {vocab_size})")
            if not -100.0 <= v <= 100.0:
                raise FieldError("logit_bias", f"logit_bias[{k!r}] = {v} is outside [-100, 100]")
            out[int(k)] = v
        return out

    def refuse_unsupported(self) -> None:
        """FieldError for the first field set to something this server does not do."""
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "stream_options is only allowed with stream=true")
        for name, (noop, why) in _NOOPS.items():
            if name in self.model_fields_set and not noop(getattr(self, name, None)):
                raise FieldError(name, f"{name} is not supported by this server: {why}")


_NOOPS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "suffix": (lambda v: v is None, "no insertion (fill-in-the-middle) mode"),
    "best_of": (lambda v: v in (None, 1), "send best_of=1"),
    "response_format": (lambda v: v == {"type": "text"},
                        "no structured output; send {\"type\": \"text\"} or nothing"),
    "tools": (lambda v: not v, "no tool calling; send no tools"),
    "tool_choice": (lambda v: v in (None, "none"), "no tool calling; send tool_choice=\"none\""),
    "parallel_tool_calls": (lambda v: v is None, "no tool calling"),
    "functions": (lambda v: not v, "no function calling"),
    "function_call": (lambda v: v in (None, "none"), "no function calling"),
    "reasoning_effort": (lambda v: v is None, "the model does not reason"),
    "modalities": (lambda v: v in (None, ["text"]), "text output only"),
    "audio": (lambda v: v is None, "text output only"),
    "prediction": (lambda v: v is None, "no predicted outputs"),
    "store": (lambda v: v in (None, False), "completions are not stored"),
    "metadata": (lambda v: not v, "completions are not stored, so there is nothing to tag"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "one service tier"),
    "web_search_options": (lambda v: v is None, "no web search"),
}
"""Field -> (is this value a no-op here, what to send instead)."""


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    """Log-probabilities of the chosen tokens and of the `logprobs` most likely ones."""
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo and self.logprobs is not None:
            raise FieldError("echo", "echo with logprobs is not supported (the prompt's "
                             "logprobs are not computed): send one of them")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """A string, or content parts of which only `{"type": "text", "text": ...}` are read."""
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None

    def for_template(self, where: str) -> dict[str, Any]:
        """The message as a chat template reads it: text parts joined with newlines (as vLLM
        joins them for string templates), `developer` as `system` (OpenAI's equivalence: a
        template written before developer messages would drop them), optional fields only
        when given."""
        content = self.content
        if isinstance(content, list):
            texts: list[str] = []
            for j, part in enumerate(content):
                kind = part.get("type")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise FieldError(f"{where}.content.{j}",
                                     f"{where}.content.{j}: only text parts "
                                     f"({{\"type\": \"text\", \"text\": ...}}) are supported, "
                                     f"got type {kind!r}")
                texts.append(part["text"])
            content = "\n".join(texts)
        if content is None and not (self.role == "assistant" and self.tool_calls):
            raise FieldError(f"{where}.content", f"{where}.content is required for a "
                             f"{self.role} message")
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": content}
        for key in ("name", "tool_call_id", "tool_calls"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    """vLLM's extension: end the prompt with the assistant's turn opened."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's extension: more variables for the chat template."""
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    web_search_options: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs=true")
        reserved = {"messages", "add_generation_prompt", "tools", "documents"} & set(
            self.chat_template_kwargs or {})
        if reserved:
            raise FieldError("chat_template_kwargs", f"chat_template_kwargs may not set "
                             f"{sorted(reserved)}: the request's own fields say those")

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template(f"messages.{i}") for i, m in enumerate(self.messages)]

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None when not asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a prompt, or messages rendered by the chat template."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    """Prepend the model's BOS (default: yes for a prompt, no for messages, as vLLM)."""
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[int]


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_choice(index: int, text: str, reason: str | None,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def chat_choice(index: int, text: str, reason: str | None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": text},
            "logprobs": logprobs, "finish_reason": reason}


def completion_doc(rid: str, model: str, choices: list[dict[str, Any]], use: dict[str, Any]
                   ) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": use}


def chat_doc(rid: str, model: str, choices: list[dict[str, Any]], use: dict[str, Any]
             ) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": use}


def chunk_doc(
    chat: bool,
    rid: str,
    model: str,
    created: int,
    text: str | None,
    reason: str | None,
    first: bool,
    logprobs: dict[str, Any] | None = None,
    *,
    index: int = 0,
) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {"content": text} if text is not None else {}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": index, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or ""}
        obj = "text_completion"
    choice["logprobs"] = logprobs
    choice["finish_reason"] = reason
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def error_doc(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, which its clients parse into exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
