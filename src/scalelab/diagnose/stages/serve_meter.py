"""The reference server metered across one load step: its process tree's CPU time and peak
resident memory, and its own count of responses, attached to the step's record (busy cores,
the cost of 1,000 predictions at the core price, governance as the server says).
"""

from __future__ import annotations

import contextlib
import urllib.request
from dataclasses import dataclass

import psutil

from scalelab.core.peak_memory import TreeSampler
from scalelab.core.records import Cost, Record
from scalelab.web.exposition import sample_sums
from scalelab.web.governance.middleware import server_governance

RECOVERY_REFERENCE = "none (one server process: no replica, no restart)"
WARMUP_S = 1.0
"""Unmeasured warm-up per level: load is offered for WARMUP_S + duration."""


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


def served_responses(base_url: str) -> float | None:
    """The server's own count of inference responses (its Prometheus counter), or None."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    # A labelled counter appears only after its first response: absent means 0 so far.
    return sample_sums(text, f"{base_url}/metrics").get("scalelab_responses_total", 0.0)


@dataclass(kw_only=True)
class ServerMeter:
    """The server's CPU time and responses across one load step, attached to its record:
    busy cores while load was offered, the cost of 1,000 predictions at the core price, and
    the server process tree's peak resident memory (sampled while the level ran)."""

    pid: int
    url: str
    core_hour_usd: float
    duration_s: float
    _cpu0: float = 0.0
    _rss0: int = 0
    _n0: float | None = None
    _peak: TreeSampler | None = None

    def start(self) -> None:
        (self._cpu0, self._rss0), self._n0 = tree_usage(self.pid), served_responses(self.url)
        self._peak = TreeSampler(self.pid, period_s=0.05).start()

    def tag(self, r: Record) -> Record:
        cpu1, rss1 = tree_usage(self.pid)
        peak = self._peak.stop() if self._peak is not None else 0
        cpu = cpu1 - self._cpu0
        n1 = served_responses(self.url)
        served = n1 - self._n0 if n1 is not None and self._n0 is not None else None
        offered_s = (r.wall_s or self.duration_s) + WARMUP_S
        extras = {**r.extras, "server_cpu_s": cpu, "cpu_busy_cores": cpu / offered_s}
        gov = server_governance(self.url)  # the sheet's governance cell, as the server says
        if gov is not None:
            extras["governance"] = gov
        update: dict[str, object] = {"extras": extras, "recovery": RECOVERY_REFERENCE,
                                     "peak_memory_bytes": max(self._rss0, rss1, peak) or None}
        if served:
            usd = cpu / 3600.0 * self.core_hour_usd
            extras["server_responses"] = served
            update["cost"] = Cost(usd=usd, per_unit_usd=usd / served * 1000.0,
                                  unit="1,000 predictions")
        return r.model_copy(update=update)
