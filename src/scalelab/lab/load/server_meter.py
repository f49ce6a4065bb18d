"""A local server metered across one load level, from outside it: its process tree's CPU time
and peak resident memory, and its own count of responses (`load run --server-pid`).

`load run` reads the meter around each level it offers, so one invocation over several rates
meters every level on its own: what a step per level did, without a process start per level.
The readings are the same ones `diagnose`'s serve stage took around a whole step: psutil on the
tree before and after, the tree's resident memory sampled while the level runs (a spike between
the two readings is the peak), the server's Prometheus counter of responses before and after.
"""

from __future__ import annotations

import contextlib
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psutil

from scalelab.lab.core.peak_memory import TreeSampler
from scalelab.layers.web.exposition import sample_sums

RESPONSES = "scalelab_responses_total"
"""The reference server's counter of inference responses (`serve run`'s /metrics)."""
SAMPLE_S = 0.1
"""How often the tree's resident memory is read while a level runs: the sampler is a thread
of the generator's own process, so it reads as often as `load llm`'s engine sampler
(`scrape.Sampler`), not more (each read takes the GIL from the generator's loop)."""


def tree_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds user + system, resident bytes) of a live process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0
    cpu, rss = 0.0, 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
    return cpu, rss


def served_responses(metrics_url: str) -> float | None:
    """The server's own count of responses (its `RESPONSES` counter), or None when its
    /metrics does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    # A labelled counter appears only after its first response: absent means 0 so far.
    return sample_sums(text, metrics_url).get(RESPONSES, 0.0)


@dataclass(kw_only=True)
class ServerMeter:
    """`start()` before a level, `stop()` after it: what the server used in between, as record
    extras (`server_cpu_s`, `server_peak_rss_bytes`, `server_responses` with a metrics URL)."""

    pid: int
    """The server's process (its children, e.g. uvicorn workers, are counted too)."""
    metrics_url: str | None = None
    """Its Prometheus /metrics, for the responses counted (None: not counted)."""
    _cpu0: float = 0.0
    _rss0: int = 0
    _n0: float | None = None
    _peak: TreeSampler | None = field(default=None, repr=False)

    def start(self) -> None:
        self._cpu0, self._rss0 = tree_usage(self.pid)
        self._n0 = served_responses(self.metrics_url) if self.metrics_url else None
        self._peak = TreeSampler(self.pid, period_s=SAMPLE_S).start()

    def stop(self) -> dict[str, Any]:
        cpu1, rss1 = tree_usage(self.pid)
        peak = self._peak.stop() if self._peak is not None else 0
        self._peak = None
        out: dict[str, Any] = {"server_cpu_s": cpu1 - self._cpu0,
                               "server_peak_rss_bytes": max(self._rss0, rss1, peak)}
        if self.metrics_url:
            n1 = served_responses(self.metrics_url)
            if n1 is not None and self._n0 is not None:
                out["server_responses"] = n1 - self._n0
        return out
