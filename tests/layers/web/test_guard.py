"""The guard middleware around a bare ASGI app: request ids, the declared and the streamed
body limit."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from scalelab.layers.web.guard import Guard, accept_request_id, request_id


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body and answers its length and the request id."""
    n = 0
    while True:
        msg = await receive()
        n += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = f"{n} {request_id(scope)}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(app: Any, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            return await c.post("/", **kw)

    return asyncio.run(go())


def test_request_id_is_kept_when_sane_and_replaced_otherwise() -> None:
    assert accept_request_id(b"rq-1.a:b_C") == "rq-1.a:b_C"
    for bad in (None, b"", b"has space", b"x" * 129, b"semi;colon"):
        fresh = accept_request_id(bad)
        assert len(fresh) == 32 and int(fresh, 16) >= 0
    app = Guard(echo, max_body=100)
    r = call(app, content=b"abc", headers={"X-Request-Id": "rq-9"})
    assert r.status_code == 200 and r.text == "3 rq-9" and r.headers["x-request-id"] == "rq-9"
    r = call(app, content=b"abc", headers={"X-Request-Id": "no good"})
    rid = r.headers["x-request-id"]
    assert len(rid) == 32 and r.text == f"3 {rid}"


def test_declared_length_over_the_limit_is_413_before_the_app() -> None:
    r = call(Guard(echo, max_body=100), content=b"x" * 101)
    assert r.status_code == 413
    assert r.json() == {"error": "request body of 101 bytes exceeds the 100-byte limit"}
    assert len(r.headers["x-request-id"]) == 32
    assert call(Guard(echo, max_body=100), content=b"x" * 100).text.startswith("100 ")


def test_streamed_body_over_the_limit_is_413() -> None:
    def chunks(n: int):  # type: ignore[no-untyped-def]
        async def gen():  # type: ignore[no-untyped-def]
            for _ in range(n):
                yield b"y" * 40
        return gen()

    r = call(Guard(echo, max_body=100), content=chunks(3))
    assert r.status_code == 413
    assert r.json() == {"error": "request body exceeds the 100-byte limit"}
    r = call(Guard(echo, max_body=120), content=chunks(3))
    assert r.status_code == 200 and r.text.startswith("120 ")


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body 0"):
        Guard(echo, max_body=0)
