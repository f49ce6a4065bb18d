"""The reference server metered across one load step: `load run --server-pid` reads its process
tree's CPU time and peak resident memory and its own count of responses around each level
(`load.server_meter`); here those readings become the record's busy cores, peak memory, the
cost of 1,000 predictions at the core price and governance as the server says.
"""

from __future__ import annotations

from typing import Any

from scalelab.lab.core.records import Cost, Record
from scalelab.lab.load import server_meter
from scalelab.lab.load.server_meter import tree_usage
from scalelab.layers.web.governance.middleware import server_governance

__all__ = ["RECOVERY_REFERENCE", "WARMUP_S", "metered", "served_responses", "tree_usage"]

RECOVERY_REFERENCE = "none (one server process: no replica, no restart)"
WARMUP_S = 1.0
"""Unmeasured warm-up per level: load is offered for WARMUP_S + duration."""
PEAK_KEY = "server_peak_rss_bytes"
"""What `load run --server-pid` records as the server tree's peak; the record's peak memory."""


def served_responses(base_url: str) -> float | None:
    """The reference server's own count of inference responses (at `base_url`/metrics)."""
    return server_meter.served_responses(f"{base_url}/metrics")


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def metered(r: Record, *, url: str, core_hour_usd: float, warmup_s: float = WARMUP_S) -> Record:
    """A level's record from `load run --server-pid`, as the verdict reads it: busy cores over
    the time load was offered (warm-up and window), the server tree's peak as the record's peak
    memory, the cost of 1,000 predictions from the CPU seconds and the responses the server
    counted, and the server's governance (its base `url`). A record without the readings (a
    server that exited) is returned unmetered."""
    extras: dict[str, Any] = dict(r.extras)
    peak = r.resources.server_peak_rss_bytes
    cpu = _num(extras.get("server_cpu_s"))
    served = _num(extras.get("server_responses"))
    if not served:
        extras.pop("server_responses", None)
    update: dict[str, object] = {"extras": extras, "recovery": RECOVERY_REFERENCE,
                                 "peak_memory_bytes": int(peak) if peak else None}
    if cpu is not None:
        update["resources"] = r.resources.model_copy(
            update={"cpu_busy_cores": cpu / ((r.wall_s or 0.0) + warmup_s)})
        if served:
            usd = cpu / 3600.0 * core_hour_usd
            update["cost"] = Cost(usd=usd, per_unit_usd=usd / served * 1000.0,
                                  unit="1,000 predictions")
    gov = server_governance(url)  # the sheet's governance cell, as the server says
    if gov is not None:
        extras["governance"] = gov
    return r.model_copy(update=update)
