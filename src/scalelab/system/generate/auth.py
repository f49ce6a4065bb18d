"""`--api-key`: the OpenAI API's Bearer authentication in front of /v1/*, as vLLM does it.

Only /v1/* needs the key; /health, /metrics, /tokenize, /detokenize and /version stay open
(probes and scrapers carry no key, and vLLM leaves the same paths open). A missing or wrong key
is a 401 with OpenAI's error body, which its clients raise as AuthenticationError.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

API_KEY_ENV = "SCALELAB_API_KEY"
"""Where `scalelab generate serve --api-key` leaves the key for the server (not in the settings
JSON, which is logged and shown)."""

_BODY = json.dumps({"error": {
    "message": "Incorrect or missing API key: send the server's key as "
               "'Authorization: Bearer <key>' (scalelab generate serve --api-key)",
    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()


class ApiKeyGuard:
    """Pure ASGI middleware: /v1/* answers 401 unless `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        if not key:
            raise ValueError("an empty API key would let everyone in")
        self.app = app
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            # constant time: the comparison must not tell how much of a guess was right
            if not hmac.compare_digest(given, self._expected):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_BODY)).encode()),
                    (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": _BODY})
                return
        await self.app(scope, receive, send)
