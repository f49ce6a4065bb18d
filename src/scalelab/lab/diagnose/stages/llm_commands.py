"""The `scalelab` commands the llm stage runs: streaming levels, the token-SLO capacity search,
and the reference engine's server (kept beside their only user, diagnose.stages.llm)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from scalelab.lab.diagnose.commands import Command, flag, positional


@dataclass(frozen=True, kw_only=True)
class _LlmTarget(Command):
    """What `load llm run` and `load llm capacity` send and where."""

    url: str = positional()
    warmup: str | None = None
    prompt_tokens: str | None = None
    output_tokens: str | None = None
    shared_prefix: int | None = None
    api: Literal["chat", "completions"] | None = None
    records: Path | None = None
    header: list[str] | None = field(default=None, metadata={"flag": "--header", "repeat": True})
    """NAME:VALUE headers sent with every request (`stages.llm.headers`)."""
    api_key_env: str | None = None
    """The variable holding the key (`stages.llm.api_key_env`): never the key itself."""


@dataclass(frozen=True, kw_only=True)
class LoadLlmRun(_LlmTarget):
    """`scalelab load llm run URL`: closed-loop streaming levels."""

    path = ("load", "llm", "run")
    concurrency: list[int]
    requests: int | None = None
    duration: str | None = None
    """A level's measured time instead of `requests` (a sized level's later chunks)."""
    model_name: str | None = flag("--model")
    usage: Literal["continuous", "final", "none"] | None = None
    metrics_url: str | None = None
    server_pid: int | None = None
    server_signals: bool = False
    prometheus: str | None = None
    core_hour_usd: float | None = None
    quality_probe: int | None = None
    cluster: str | None = None
    """A Dask scheduler whose workers generate the load (`client.cluster`)."""


@dataclass(frozen=True, kw_only=True)
class LoadLlmCapacity(_LlmTarget):
    """`scalelab load llm capacity URL`: the highest request rate meeting a token objective."""

    path = ("load", "llm", "capacity")
    slo: str
    start: float
    max_rate: float
    min_step: str
    max_step: str
    max_steps: int
    confirm: str | None = None
    """Length of the confirmation run of the answer (`load llm capacity --confirm`)."""
    budget: str | None = None
    """Time for the whole search (`--budget`; `serve_search.search_budget`)."""


@dataclass(frozen=True, kw_only=True)
class GenerateServe(Command):
    """`scalelab generate serve`: the reference engine's OpenAI-compatible server."""

    path = ("generate", "serve")
    emits_json = False  # a server prints no result document
    model: str
    host: str = "127.0.0.1"
    port: int


@dataclass(frozen=True, kw_only=True)
class GenerateQuality(Command):
    """`scalelab generate quality`: weights settings against fp32 of the same file."""

    path = ("generate", "quality")
    model: str
    weights: list[str]
    tokens: int | None = None
    report_only: bool = True
