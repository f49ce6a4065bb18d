"""The one error a request handler raises to answer with a status other than 200.

Every server (serve's Open Inference Protocol, generate's OpenAI-compatible API, retrieval's
JSON API) raises `HttpError` and turns it into its own wire body at the edge: serve and
retrieval as `{"error": message}`, generate as OpenAI's `{"error": {message, type, param,
code}}`. The message names what is wrong and how to fix it; `headers` carry what the status
needs (Retry-After on 429/503, WWW-Authenticate on 401).
"""

from __future__ import annotations


class HttpError(Exception):
    """A request answered with `status`: a message, and optional headers; for APIs whose
    error body says more (OpenAI's), its `type`, `param` and `code`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, *,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers: dict[str, str] = headers or {}
