"""The engine's own signals during a load level: sample its Prometheus /metrics 10 times a second.

A generation engine knows what limits it before the client sees it in TTFT: sequences waiting
for a batch slot, KV-cache blocks in use, preemptions (a sequence evicted when blocks ran out).
vLLM's names are the de-facto standard (our engine uses them too), so a user's vLLM endpoint
gives the same signals. The sampler runs in a thread beside the level, so the generator's loop
never waits on it (a scrape costs the server well under a millisecond; gauges that change per
step need a short period to be seen at all); a server without /metrics yields no signals.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from scalelab.lab.core.sampling import SamplingThread
from scalelab.lab.core.sheet import STAGE_LIMIT_KEY
from scalelab.lab.load.server_meter import tree_usage
from scalelab.layers.web.exposition import ExpositionError, sample_sums

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
COUNTERS = {"preemptions": "vllm:num_preemptions_total",
            "generation_tokens": "vllm:generation_tokens_total"}
log = logging.getLogger("scalelab.lab.load")


def parse_metrics(text: str, source: str = "the /metrics text") -> dict[str, float]:
    """Sum of each sample's values over its labels, read by prometheus-client's parser; an
    `ExpositionError` naming `source` and the line when the text is not Prometheus text."""
    return sample_sums(text, source)


@dataclass(kw_only=True)
class Signals:
    """What the engine reported over one level."""

    samples: int = 0
    """Scrapes that answered."""
    peak: dict[str, float] = field(default_factory=dict)
    """Largest value of each gauge (running, waiting, kv_usage)."""
    mean: dict[str, float] = field(default_factory=dict)
    """Mean of each gauge over the scrapes."""
    delta: dict[str, float] = field(default_factory=dict)
    """Increase of each counter (preemptions, generation_tokens) over the level."""

    def extras(self) -> dict[str, float | int]:
        """Flat record extras: engine_<gauge>_max / _mean, engine_<counter>."""
        d: dict[str, float | int] = {"engine_scrapes": self.samples}
        for k, v in self.peak.items():
            d[f"engine_{k}_max"] = v
        for k, v in self.mean.items():
            d[f"engine_{k}_mean"] = v
        for k, v in self.delta.items():
            d[f"engine_{k}"] = v
        return d


def summarize(scrapes: list[dict[str, float]]) -> Signals:
    """Pure: peaks and means of the gauges, first-to-last increase of the counters."""
    s = Signals(samples=len(scrapes))
    for key, name in GAUGES.items():
        vals = [x[name] for x in scrapes if name in x]
        if vals:
            s.peak[key] = max(vals)
            s.mean[key] = sum(vals) / len(vals)
    for key, name in COUNTERS.items():
        vals = [x[name] for x in scrapes if name in x]
        if len(vals) >= 2:
            s.delta[key] = max(0.0, vals[-1] - vals[0])
    return s


class Sampler(SamplingThread):
    """`with Sampler(url, pid=PID) as s:` scrapes `url` every `period_s` until the block ends,
    and (with `pid`) reads the CPU time and resident memory of that process and its children:
    the server's own busy cores, which the verdict compares with the machine's."""

    def __init__(self, url: str | None, period_s: float = 0.1, pid: int | None = None) -> None:
        super().__init__(period_s, "metrics-scrape")
        self.url = url
        self.scrapes: list[dict[str, float]] = []
        self.malformed = 0
        """Scrapes that answered with text that is not Prometheus exposition (warned once)."""
        self.pid = pid
        self._cpu0: tuple[float, float] | None = None
        self._cpu1: tuple[float, float] | None = None
        self.peak_rss = 0

    def _process(self) -> None:
        """CPU seconds and resident memory of the server's process tree (one psutil read)."""
        assert self.pid is not None
        cpu, rss = tree_usage(self.pid)
        mark = (time.monotonic(), cpu)
        if self._cpu0 is None:
            self._cpu0 = mark
        self._cpu1 = mark
        self.peak_rss = max(self.peak_rss, rss)

    def _sample(self) -> None:
        if self.pid is not None:
            self._process()
        if self.url is None:
            return
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                text = r.read().decode("utf-8", "replace")
        except (OSError, urllib.error.URLError, ValueError):
            return  # a server without /metrics, or one too busy to answer: no sample
        try:
            self.scrapes.append(parse_metrics(text, self.url))
        except ExpositionError as e:
            self.malformed += 1
            if self.malformed == 1:  # said once, not ten times a second
                log.warning("engine signals: %s", e)

    def process_extras(self) -> dict[str, float | int]:
        """cpu_busy_cores (what the verdict reads), server_cpu_s (what energy is estimated
        from) and server_peak_rss_bytes of the server."""
        if self._cpu0 is None or self._cpu1 is None or self._cpu1[0] <= self._cpu0[0]:
            return {}
        wall = self._cpu1[0] - self._cpu0[0]
        cpu = self._cpu1[1] - self._cpu0[1]
        return {"cpu_busy_cores": cpu / wall, "server_cpu_s": cpu,
                "server_peak_rss_bytes": self.peak_rss}


    def signals(self) -> Signals:
        return summarize(self.scrapes)

    def extras(self) -> dict[str, float | int]:
        """Everything sampled, as flat record extras."""
        return {**(self.signals().extras() if self.url else {}), **self.process_extras()}


def engine_seen(extras: dict[str, Any]) -> list[str]:
    """The engine's measured numbers of a level, as phrases: sequences running and waiting,
    KV-cache usage, preemptions (those it sampled)."""

    def num(key: str) -> float | None:
        v = extras.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    running, waiting = num("engine_running_max"), num("engine_waiting_max")
    kv, pre = num("engine_kv_usage_max"), num("engine_preemptions")
    return [
        *([f"up to {running:g} sequences running"] if running is not None else []),
        *([f"up to {waiting:g} waiting for a slot"] if waiting is not None else []),
        *([f"KV cache {kv:.0%} used"] if kv is not None else []),
        *([f"{pre:g} preemptions"] if pre else []),
    ]


def limit_evidence(extras: dict[str, Any]) -> str | None:
    """The sheet's limit cell from a level's engine signals (`core.sheet.STAGE_LIMIT_KEY`),
    e.g. 'batch-slots: up to 4 sequences running, up to 4 waiting for a slot (engine
    /metrics)'; None without samples, or when the engine ran out of nothing (its "compute" is
    the absence of the other signals, not a measurement)."""
    if not extras.get("engine_scrapes"):
        return None
    sig = limiting_signal(extras)
    if sig == "compute":
        return None
    return f"{sig}: {', '.join(engine_seen(extras))} (engine /metrics)"


LIMITING_SIGNAL_KEY = "limiting_signal"
"""Record extra: what the engine ran out of (`limiting_signal`)."""


def note_limits(extras: dict[str, Any]) -> str | None:
    """Set (or clear) a level's limit extras from its engine signals: `limiting_signal` and
    the sheet's limit cell (`limit_evidence`); returns the limiting signal, None without
    engine samples."""
    extras.pop(LIMITING_SIGNAL_KEY, None)
    extras.pop(STAGE_LIMIT_KEY, None)
    limit = limiting_signal(extras) if extras.get("engine_scrapes") else None
    if limit:
        extras[LIMITING_SIGNAL_KEY] = limit
    said = limit_evidence(extras)
    if said:
        extras[STAGE_LIMIT_KEY] = said
    return limit


def limiting_signal(extras: dict[str, float | int]) -> str:
    """What the engine ran out of during a level, from `Signals.extras()`: the KV pool
    (preemptions, or usage at 95%+), batch slots (requests waited), else compute."""
    if (extras.get("engine_preemptions") or 0) > 0 or \
            (extras.get("engine_kv_usage_max") or 0) >= 0.95:
        return "kv-cache"
    if (extras.get("engine_waiting_max") or 0) >= 1:
        return "batch-slots"
    return "compute"
