"""The server's side of one level: `ServerReader` started before the level and stopped after it
returns the record's `ServerSignals`, each number with where it came from.

Three sources, each optional: the endpoint's /metrics page (the standard process metrics, and
an engine's own names: engines.py), the local server's process tree (by pid, or found from the
port the endpoint listens on: process.py), and a Prometheus server's series over the level's
window (prometheus.py). The page and the tree are sampled on a thread every `period_s` — a
scrape costs the server well under a millisecond, and gauges such as a queue's depth change
faster than the level — so the generator's loop never waits on them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.sampling import SamplingThread
from scalelab.lab.core.signals import ServerSignals, SignalSource
from scalelab.lab.load.server import engines, prometheus
from scalelab.lab.load.server.process import (
    TreeSample,
    busiest_thread,
    local_port,
    pid_on_port,
    read_tree,
    run_queue_wait,
)
from scalelab.layers.web.exposition import ExpositionError, sample_sums

if TYPE_CHECKING:
    from scalelab.lab.load.result import LevelResult

log = logging.getLogger("scalelab.lab.load")
PERIOD_S = 0.5
"""How often the page and the tree are read during a level: each read runs in the generator's
process and takes the GIL from its loop, so no more often than the gauges need."""


def metrics_url_of(url: str) -> str:
    """The endpoint's /metrics: same scheme, host and port."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}/metrics"


def _get(url: str, timeout_s: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return bytes(r.read(8 << 20))
    except (OSError, urllib.error.URLError, ValueError):
        return None


class ServerReader(SamplingThread):
    """`r = ServerReader(url, ...)`, `r.start()` before a level, `r.read()` after it."""

    def __init__(self, url: str, *, metrics_url: str | None = None, pid: int | None = None,
                 prometheus_url: str | None = None, prometheus_match: str = "",
                 period_s: float = PERIOD_S) -> None:
        super().__init__(period_s, "server-signals")
        self.url = url
        self.metrics_url = metrics_url or metrics_url_of(url)
        port = local_port(url)
        self.found_by = "given" if pid is not None else "port"
        self.pid = pid if pid is not None else (pid_on_port(port) if port else None)
        self.port = port
        self.prometheus_url = prometheus_url
        self.prometheus_match = prometheus_match
        self.scrapes: list[engines.Scrape] = []
        self._page = True
        """False once the page answered something that is not Prometheus text (or 404)."""
        self._tree: list[tuple[float, TreeSample]] = []
        self._wall: tuple[float, float] = (0.0, 0.0)
        self._slots: tuple[int, int] | None = None

    def start(self) -> ServerReader:
        self._wall = (time.time(), 0.0)
        body = _get(f"{urlsplit(self.metrics_url).scheme}://{urlsplit(self.metrics_url).netloc}"
                    "/slots")
        if body is not None:
            with contextlib.suppress(ValueError):
                self._slots = engines.slots_of(json.loads(body))
        super().start()
        return self

    def _sample(self) -> None:
        now = time.monotonic()
        if self.pid is not None and (t := read_tree(self.pid)) is not None:
            self._tree.append((now, t))
        if not self._page:
            return
        body = _get(self.metrics_url)
        if body is None:
            if not self.scrapes:
                self._page = False  # no page (404, refused): not asked again this level
            return
        try:
            self.scrapes.append((now, sample_sums(body.decode("utf-8", "replace"),
                                                  self.metrics_url)))
        except ExpositionError as e:
            self._page = False
            log.warning("server signals: %s", e)

    def read(self) -> ServerSignals | None:
        """Stop sampling and return what the level showed; None when no source answered."""
        self.halt()
        self._wall = (self._wall[0], time.time())
        fields: dict[str, Any] = {}
        sources: dict[str, str] = {}
        kinds: dict[str, SignalSource] = {}

        def put(values: dict[str, Any], source: str, kind: SignalSource) -> None:
            for k, v in values.items():
                if k not in fields and v is not None:
                    fields[k], sources[k], kinds[k] = v, source, kind

        put(self._from_tree(), self._tree_source(), "process")
        put(engines.process_reading(self.scrapes), self.metrics_url, "metrics")
        eng, values = engines.engine_reading(self.scrapes)
        if eng is not None:
            put(values, f"{eng.name} {self.metrics_url}", "engine")
        if self._slots is not None:
            put({"slots": self._slots[0]}, f"llamacpp {self.metrics_url.rsplit('/', 1)[0]}"
                "/slots", "engine")
        if self.prometheus_url:
            try:
                got, where = prometheus.read_window(self.prometheus_url, start=self._wall[0],
                                                    end=self._wall[1],
                                                    match=self.prometheus_match)
            except BadInputError as e:
                log.warning("server signals: %s", e)
            else:
                for k, v in got.items():
                    put({k: v}, where[k], "prometheus")
        if not fields:
            return None
        if "cores" not in fields and kinds.get("busy_cores") in ("process", "metrics") and \
                self.port is not None:
            fields["cores"] = os.cpu_count() or 1  # a local server: this machine's cores
        return ServerSignals(engine=eng.name if eng else None, sources=sources, kinds=kinds,
                             **fields)

    def _tree_source(self) -> str:
        how = f"port {self.port}" if self.found_by == "port" else "given"
        return f"process pid {self.pid} ({how})"

    def _from_tree(self) -> dict[str, Any]:
        if len(self._tree) < 2:
            return {}
        (t0, a), (t1, b) = self._tree[0], self._tree[-1]
        if t1 <= t0:
            return {}
        run, wait = busiest_thread(a, b)
        return {"busy_cores": max(0.0, b.cpu_s - a.cpu_s) / (t1 - t0),
                "cpu_wait_cores": run_queue_wait(a, b) / (t1 - t0),
                "busiest_thread_cores": run / (t1 - t0),
                "busiest_thread_wait_cores": wait / (t1 - t0),
                "threads": max(t.threads for _, t in self._tree),
                "rss_bytes": max(t.rss_bytes for _, t in self._tree)}


REFUSALS = ("429", "503")
"""Statuses a server answers when it turns work away at admission (Too Many Requests, Service
Unavailable): a limit of the server, not an error of the request."""


CUT = ("dropped", "empty")
"""Stream error kinds (load/llm/stream.py) of a stream cut short or left empty."""


def level_signals(reader: ServerReader | None, r: LevelResult) -> ServerSignals | None:
    """The level's server signals: what `reader` read (stopping it), with what the client of
    level `r` saw of the server: its refusals at admission (by status, per second, and the
    Retry-After they carried) and the streams it saw cut short; None when there is neither."""
    sig = reader.read() if reader is not None else None
    requests = r.successes + r.failures
    cut = sum(v for k, v in r.errors_by_kind.items() if k in CUT)
    if cut:
        base = sig or ServerSignals()
        sig = base.model_copy(update={
            "cut_streams": cut, "requests": requests,
            "sources": {**base.sources, "cut_streams": "client: streams dropped or empty"},
            "kinds": {**base.kinds, "cut_streams": "client"}})
    refused = {k: v for k, v in sorted(r.errors_by_status.items()) if k in REFUSALS and v}
    if not refused:
        return sig
    n = sum(refused.values())
    codes = ", ".join(f"{v:,} × {k}" for k, v in refused.items())
    base = sig or ServerSignals()
    said = min(r.retry_after_count, n)
    ra = ({"retry_after": f"client: Retry-After on {said:,} of the {n:,} refusals"}
          if said else {})
    return base.model_copy(update={
        "refused": n, "refused_by_status": refused, "requests": requests,
        "refused_rps": n / r.wall_s if r.wall_s > 0 else None,
        "retry_after": said > 0, "retry_after_count": said,
        "retry_after_s": r.retry_after_max_s if said else None,
        "sources": {**base.sources, "refused": f"client: {codes}", **ra},
        "kinds": {**base.kinds, "refused": "client",
                  **({"retry_after": "client"} if said else {})}})


def start_reader(url: str, *, enabled: bool, pid: int | None = None,
                 prometheus_url: str | None = None) -> ServerReader | None:
    """A started reader for one level when the server's side is asked for (`enabled`, or a
    Prometheus URL given)."""
    if not (enabled or prometheus_url):
        return None
    return ServerReader(url, pid=pid, prometheus_url=prometheus_url).start()
