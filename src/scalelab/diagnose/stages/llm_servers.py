"""The llm stage's reference engine servers, started together so their start-ups overlap.

One `scalelab generate serve` a series, TOGETHER at a time (diagnose.stages.llm)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

from scalelab.core.errors import RunFailedError
from scalelab.diagnose.stages.base import Context
from scalelab.diagnose.stages.llm_commands import GenerateServe
from scalelab.diagnose.steps import scalelab_cmd
from scalelab.web.spawn import Spawned, start_server

SERVER_START_S = 13.0
"""TOGETHER reference engine servers' start (imports, the GGUF read, its blocks installed:
~12 CPU-seconds each, mostly one core's), 2-core machine: one took ~10.6 s of the quiet 64 s
demo stage (2026-12-03 11:38 UTC); two at once on 2 cores, an estimate (see llm.STEP_START_S)."""
TOGETHER = 2
"""Servers started at once: each start is mostly one core's work (the GGUF read), so two
overlap on 2 cores; the next starts wait until the series before them are done, so a start
never shares the CPU with a measurement."""


def server_starts(series: list[str]) -> int:
    """How many start-up waits the servers of these series take (TOGETHER at a time)."""
    return math.ceil(len(series) / TOGETHER)


def start_servers(ctx: Context, model: str, series: list[str],
                  flags: dict[str, list[str]]) -> dict[str, Spawned | str]:
    """Start the reference engine's server of each series at once (threads waiting on
    `start_server`); each a running server, or why it did not start."""

    def one(name: str) -> Spawned | str:
        def cmd(port: int) -> list[str]:
            return scalelab_cmd([*GenerateServe(model=model, port=port).to_argv(),
                                 *flags[name]])
        try:
            return start_server(cmd, ready_path="/health", timeout_s=180.0,
                                log=ctx.logs / f"server-llm-{name}.log")
        except RunFailedError as e:
            return str(e)

    ctx.logs.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=len(series)) as pool:
        return dict(zip(series, pool.map(one, series), strict=True))
