"""The llm stage's reference engine servers, started together so their start-ups overlap.

One `scalelab generate serve` a series, TOGETHER at a time (diagnose.stages.llm)."""

from __future__ import annotations

import math

from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.stages.llm_commands import GenerateServe
from scalelab.lab.diagnose.stages.serve_servers import Planned, start_all
from scalelab.lab.diagnose.steps import scalelab_cmd
from scalelab.layers.web.spawn import Spawned

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
    """Start the reference engine's server of each series at once (`serve_servers.start_all`);
    each a running server, or why it did not start."""

    def planned(name: str) -> Planned:
        def cmd(port: int) -> list[str]:
            return scalelab_cmd([*GenerateServe(model=model, port=port).to_argv(),
                                 *flags[name]])
        return Planned(key=name, command=cmd, log=ctx.logs / f"server-llm-{name}.log",
                       ready_path="/health")

    return start_all([planned(name) for name in series], timeout_s=180.0)
