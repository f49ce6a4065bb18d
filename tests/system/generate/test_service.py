"""The generative server's handler methods called directly on the tiny model: no socket, no
server, no TestClient. The engine thread runs (the service's own lifespan); the KV pool and
the admission count are whole again after every request, refused ones included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI

import scalelab
from scalelab.layers.nets.llama import build_tiny
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.hook import local_request
from scalelab.system.generate.app import ApiSettings
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.protocol import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    FieldError,
    TokenizeRequest,
)
from scalelab.system.generate.service import GenerationService
from scalelab.system.generate.stream import ReleasingStream
from scalelab.system.generate.tokenizer import byte_tokenizer

MODEL = "tiny-llama"
ENGINE = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 256}
T = TypeVar("T")


def service(**kw: Any) -> GenerationService:
    engine_cfg = {**ENGINE, **kw.pop("engine", {})}
    return GenerationService(ApiSettings(model="tiny", engine=engine_cfg, **kw),
                             LlmEngine(build_tiny(seed=1), byte_tokenizer(),
                                       LlmEngineConfig(**engine_cfg), name=MODEL))


def running(svc: GenerationService, work: Callable[[], Awaitable[T]]) -> T:
    """`work` with the engine thread up (the service's lifespan), then stopped."""
    async def go() -> T:
        async with svc.lifespan(FastAPI()):
            return await work()
    return asyncio.run(go())


async def whole(svc: GenerationService) -> dict[str, Any]:
    """The pool once the engine has dropped every finished or aborted sequence."""
    for _ in range(2000):
        p = await svc.pool()
        if p["whole"] and p["live"] == 0:
            return p
        await asyncio.sleep(0.005)
    raise AssertionError(f"the KV pool is not whole again: {await svc.pool()}")


def body_of(resp: Any) -> Any:
    return json.loads(bytes(resp.body))


def test_listings_tokenize_detokenize_and_version() -> None:
    svc = service()
    listed = asyncio.run(svc.models())
    assert [m["id"] for m in listed["data"]] == [MODEL]
    assert asyncio.run(svc.model(MODEL))["max_model_len"] == 256
    with pytest.raises(HttpError) as e:
        asyncio.run(svc.model("gpt-4"))
    assert (e.value.status, e.value.code) == (404, "model_not_found")
    tok = asyncio.run(svc.tokenize(TokenizeRequest(prompt="abc", add_special_tokens=False)))
    assert tok == {"count": 3, "max_model_len": 256, "tokens": tok["tokens"], "token_strs": None}
    back = asyncio.run(svc.detokenize(DetokenizeRequest(tokens=tok["tokens"])))
    assert back == {"prompt": "abc"}
    with pytest.raises(FieldError) as f:
        asyncio.run(svc.tokenize(TokenizeRequest()))
    assert f.value.param == "prompt"
    with pytest.raises(FieldError) as d:
        asyncio.run(svc.detokenize(DetokenizeRequest(tokens=[1, 10**6])))
    assert d.value.param == "tokens" and "[1000000]" in d.value.message
    assert asyncio.run(svc.version()) == {"version": scalelab.__version__}


def test_health_follows_the_engine_thread() -> None:
    svc = service()

    async def probe() -> int:
        return (await svc.health()).status_code

    assert running(svc, probe) == 200
    assert asyncio.run(probe()) == 503  # the lifespan stopped the engine thread


def test_completion_whole_then_the_pool_is_whole() -> None:
    svc = service()
    req = CompletionRequest(model=MODEL, prompt="hello", max_tokens=5, temperature=0.0,
                            ignore_eos=True)

    async def work() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        first = body_of(await svc.completions(req, local_request("POST", "/v1/completions")))
        again = body_of(await svc.completions(req, local_request("POST", "/v1/completions")))
        return first, again, await whole(svc)

    first, again, pool = running(svc, work)
    n_prompt = len(byte_tokenizer().encode("hello"))
    assert first["usage"]["prompt_tokens"] == n_prompt
    assert first["usage"]["completion_tokens"] == 5
    assert first["choices"][0]["finish_reason"] == "length"
    assert again["choices"][0]["text"] == first["choices"][0]["text"]  # greedy repeats
    assert (pool["outstanding"], pool["used"]) == (0, 0)


def test_chat_answers_with_the_assistant_role() -> None:
    svc = service()
    req = ChatRequest(model=MODEL, messages=[ChatMessage(role="user", content="hi")], max_tokens=3,
                      temperature=0.0, ignore_eos=True)

    async def work() -> dict[str, Any]:
        return body_of(await svc.chat(req, local_request("POST", "/v1/chat/completions")))

    doc = running(svc, work)
    assert doc["object"] == "chat.completion" and doc["model"] == MODEL
    assert doc["choices"][0]["message"]["role"] == "assistant"
    assert doc["usage"]["completion_tokens"] == 3


def test_refusals_name_the_limit_and_leave_the_count_whole() -> None:
    svc = service(engine={"max_num_seqs": 1}, max_waiting=0, max_output_tokens=8)

    async def work() -> tuple[HttpError, HttpError, HttpError, int, dict[str, Any]]:
        def req(**kw: Any) -> CompletionRequest:
            return CompletionRequest(model=MODEL, prompt="x", ignore_eos=True,
                                     **{"max_tokens": 4, **kw})

        too_long = await refused(svc.completions(req(max_tokens=9), local_request("POST", "/")))
        many = await refused(svc.completions(req(n=2), local_request("POST", "/")))
        # a stream holds the one slot until it is closed; the next request is refused at once
        held = await svc.completions(req(max_tokens=8, stream=True), local_request("POST", "/"))
        busy = await refused(svc.completions(req(), local_request("POST", "/")))
        held_count = svc.inflight.count
        assert isinstance(held, ReleasingStream)
        held.on_close()  # what the stream runs however it ends
        return too_long, many, busy, held_count, await whole(svc)

    too_long, many, busy, held_count, pool = running(svc, work)
    assert (too_long.status, too_long.param) == (400, "max_tokens")
    assert "max_output_tokens=8" in too_long.message
    assert (many.status, many.param) == (400, "n")
    assert busy.status == 429 and busy.headers == {"Retry-After": "1"}
    assert held_count == 1
    assert (pool["outstanding"], pool["used"]) == (0, 0)


async def refused(call: Awaitable[Any]) -> HttpError:
    try:
        await call
    except HttpError as e:
        return e
    raise AssertionError("the request was not refused")
