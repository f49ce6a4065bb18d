"""A FastAPI app for the real-server tests, served by uvicorn (h11) in a subprocess: what is
tested is uvicorn's HTTP, not this app. Routes: / (a small JSON), /chunked (a body uvicorn
sends with Transfer-Encoding: chunked), /busy (503 with Retry-After: 7, as an admission limit
answers), /auth (401 unless 'Authorization: Bearer s3cret')."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

app = FastAPI()


@app.get("/")
def root() -> dict[str, str]:
    return {"ok": "yes"}


@app.get("/chunked")
def chunked() -> StreamingResponse:
    def pieces() -> Iterator[bytes]:
        yield from (b"one,", b"two,", b"three")

    return StreamingResponse(pieces(), media_type="text/plain")


@app.get("/busy")
def busy() -> Response:
    return Response("busy", status_code=503, headers={"Retry-After": "7"})


@app.get("/auth")
def auth(request: Request) -> Response:
    if request.headers.get("authorization") != "Bearer s3cret":
        return Response("no", status_code=401)
    return Response("ok")
