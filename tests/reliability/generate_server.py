"""Shared by the generation fault and soak tests: a real `scalelab generate serve` process on
127.0.0.1 with the tiny model, its KV-pool probe, and the reference answer computed apart from
the server (plain greedy decoding by full recomputation, no KV cache)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

from llmkit import generate_server as tiny_generate_server
from scalelab.layers.nets.llama import build_tiny, tiny_config
from scalelab.layers.web.spawn import Spawned
from scalelab.system.generate.tokenizer import byte_tokenizer

MODEL = "tiny-llama"
TOK = byte_tokenizer()


@contextlib.contextmanager
def generate_server(log: Path, *flags: str, max_model_len: int,
                    env: dict[str, str] | None = None) -> Iterator[Spawned]:
    """`llmkit.generate_server` (seed 0, one torch thread) with the fp32 weights the plain
    reference forward uses (the CLI default is q4), `flags`, and `env` added to this process's
    environment."""
    with tiny_generate_server(log, "--weights", "fp32", "--max-model-len", str(max_model_len),
                              *flags, env=env) as s:
        yield s


def pool(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/v1/debug/pool", timeout=10).json())


def assert_pool_whole(url: str) -> dict[str, Any]:
    """Every block free, the pool's invariants intact (ref counts, prefix cache), no request
    outstanding, live, running or waiting. The engine drops an aborted request before its next
    step, so poll (bounded) until it has."""
    deadline = time.monotonic() + 20
    while True:
        p = pool(url)
        idle = (p["outstanding"], p["live"], p["running"], p["waiting"]) == (0, 0, 0, 0)
        if p["whole"] and p["problems"] == [] and p["free"] == p["num_blocks"] and idle:
            return p
        if time.monotonic() > deadline:
            raise AssertionError(f"KV pool not whole again: {p}")
        time.sleep(0.05)


def greedy_text(prompt: list[int], n: int, max_model_len: int) -> str:
    """What the server must answer for `prompt` (greedy, ignore_eos, n tokens), computed
    without the engine: the same seeded weights, full recomputation every token."""
    model = build_tiny(seed=0, cfg=tiny_config(max_position_embeddings=max_model_len))
    x = torch.tensor([prompt])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            t = int(model(x)[0, -1].argmax())
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]])], dim=1)
    return TOK.decode(out)


def complete(url: str, prompt: list[int], n: int, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0,
        "ignore_eos": True, **extra})


def stream_text(lines: list[str]) -> tuple[str, dict[str, Any]]:
    """The text and the usage of a whole SSE completion stream asked with
    `stream_options: {include_usage: true}` (STREAM_USAGE): as OpenAI sends it, usage comes once,
    in a last chunk whose `choices` is empty."""
    assert lines[-1] == "data: [DONE]", lines[-3:]
    docs = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert docs[-1]["choices"] == [] and all(d.get("usage") is None for d in docs[:-1]), docs[-2:]
    return "".join(d["choices"][0]["text"] for d in docs[:-1]), docs[-1]["usage"]


STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
"""The fields of a streamed request whose usage `stream_text` reads."""
