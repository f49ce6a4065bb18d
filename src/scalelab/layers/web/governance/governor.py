"""The governance state of one server process: who is asking, may they, and what they burned.

`Governor.admit(client, model)` answers a request before any work is done: a stopped model or
client (the kill switch), an exhausted budget, a full concurrency cap or an empty token bucket
refuse it (a `Refusal` naming the limit); otherwise it is counted in flight until `release`.
The clocks are injected (monotonic for buckets and ticks, wall for the UTC budget windows, CPU
for core-seconds), so tests drive every transition with exact numbers; the policies themselves
are the pure functions of `web.governance.limits`.

Costs on the hot path, per request: one dict lookup for the client (plus one SHA-256 of the
key when clients have keys), one bucket update, two counters; budgets add one wall-clock read
and a comparison each. Metrics are read from this state when scraped (`collect`), never
written per request. State is per process: with several workers each enforces its own copy.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from scalelab.layers.web.governance.config import (
    DEFAULT_CLIENT,
    NAME_PATTERN,
    GovernanceConfig,
    Limits,
)
from scalelab.layers.web.governance.limits import (
    PERIOD_S,
    Bucket,
    amount,
    apportion,
    exhausted,
    full_bucket,
    retry_after,
    take,
    utc_iso,
    window_start,
)

ALL = "*"
"""The label value of the side a budget does not split by (a client's budget covers every
model: model="*"; a model's covers every client: client="*")."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is not admitted, as the HTTP answer says it."""

    status: int
    reason: str
    """rate, concurrency, budget, stopped_model or stopped_client (the metric's label)."""
    message: str
    retry_after_s: int | None = None


class Meter:
    """One budget's burn in its current window."""

    __slots__ = ("client", "end", "limit", "model", "period", "start", "unit", "used")

    def __init__(self, client: str, model: str, unit: str, period: str, limit: float) -> None:
        self.client, self.model, self.unit, self.period, self.limit = (
            client, model, unit, period, limit)
        self.start = self.end = float("-inf")
        self.used = 0.0

    def roll(self, wall: float) -> None:
        if wall >= self.end or wall < self.start:
            self.start = window_start(wall, self.period)
            self.end = self.start + PERIOD_S[self.period]
            self.used = 0.0

    @property
    def owner(self) -> str:
        return f"client '{self.client}'" if self.model == ALL else f"model '{self.model}'"

    def refusal(self, wall: float) -> Refusal:
        return Refusal(429, "budget",
                       f"{self.owner} used its budget of {amount(self.limit, self.unit)} per "
                       f"{self.period} ({amount(round(self.used, 6), self.unit)} used); it "
                       f"resets at {utc_iso(self.end)}", retry_after(self.end - wall))


class ClientState:
    __slots__ = ("bucket", "burst", "cap", "inflight", "meters", "name", "rate", "stopped")

    def __init__(self, name: str, limits: Limits, now: float) -> None:
        self.name = name
        self.rate = limits.rate
        self.burst = limits.bucket_size
        self.cap = limits.max_concurrency
        self.bucket: Bucket = full_bucket(self.burst, now)
        self.inflight = 0
        self.meters = [Meter(name, ALL, b.unit, b.period, b.limit) for b in limits.budgets]
        self.stopped = False


class Governor:
    """Identity, limits, budgets and kill switches for one process (see the module doc)."""

    def __init__(self, config: GovernanceConfig, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.config = config
        self.clock, self.wall, self.cpu = clock, wall, cpu
        now = clock()
        self.default = ClientState(DEFAULT_CLIENT, config.default, now)
        self.clients: dict[str, ClientState] = {DEFAULT_CLIENT: self.default}
        self.by_digest: dict[str, ClientState] = {}
        self.by_header: dict[bytes, ClientState] = {}
        for name, c in config.clients.items():
            st = self.clients[name] = ClientState(name, c, now)
            digests = c.digests()
            for d in digests:
                self.by_digest[d] = st
            if not digests:  # a client with keys must present one; a header cannot name it
                self.by_header[name.encode()] = st
        self.header = config.client_header.lower().encode() if config.client_header else None
        self.model_meters: dict[str, list[Meter]] = {
            m: [Meter(ALL, m, b.unit, b.period, b.limit) for b in mb.budgets]
            for m, mb in config.models.items()}
        self.meters = [m for c in self.clients.values() for m in c.meters] + \
            [m for ms in self.model_meters.values() for m in ms]
        self.stopped_models: set[str] = set()
        self.released_models: set[str] = set()
        """Models once stopped and now released (their gauge reads 0, not absent)."""
        self.model_inflight: dict[str, int] = {}
        self.refusals: dict[tuple[str, str, str], int] = {}
        # core-seconds: requests finished per (client, model) in the open tick
        self.cpu_metered = any(m.unit == "core_seconds" for m in self.meters)
        self.tick_s = config.cpu_tick_s
        self.tick_counts: dict[tuple[str, str], int] = {}
        self.tick_at = now
        self.cpu_at = cpu() if self.cpu_metered else 0.0

    # -- identity ------------------------------------------------------------------------------

    def identify(self, headers: list[tuple[bytes, bytes]]) -> ClientState:
        """The client a request's headers name: an API key (Authorization: Bearer or
        X-API-Key) of a configured client, else the configured header's value when it names a
        client without keys, else the default class."""
        by_digest, header = self.by_digest, self.header
        if not by_digest and header is None:
            return self.default
        key: bytes | None = None
        named: bytes | None = None
        for k, v in headers:
            if k == b"authorization" and by_digest:
                scheme, _, rest = v.partition(b" ")
                if scheme.lower() == b"bearer":
                    key = rest.strip()
            elif k == b"x-api-key" and by_digest:
                key = v.strip()
            elif k == header:
                named = v
        if key:
            st = by_digest.get(hashlib.sha256(key).hexdigest())
            if st is not None:
                return st
        if named is not None:
            return self.by_header.get(named, self.default)
        return self.default

    # -- admission -----------------------------------------------------------------------------

    def admit(self, client: ClientState, model: str) -> Refusal | None:
        """None and the request counts in flight (call `release` when it ends), or why not."""
        if self.stopped_models and model in self.stopped_models:
            return self._refuse(client, model, Refusal(
                503, "stopped_model", f"model '{model}' is stopped by an operator (kill "
                                      "switch); requests are refused until it is released"))
        if client.stopped:
            return self._refuse(client, model, Refusal(
                self.config.client_stop_status, "stopped_client",
                f"client '{client.name}' is stopped by an operator (kill switch); its requests "
                "are refused until it is released"))
        mm = self.model_meters.get(model) if self.model_meters else None
        if client.meters or mm:
            wall = self.wall()
            for m in (*client.meters, *(mm or ())):
                m.roll(wall)
                if exhausted(m.used, m.limit, m.unit):
                    return self._refuse(client, model, m.refusal(wall))
        cap = client.cap
        if cap is not None and client.inflight >= cap:
            return self._refuse(client, model, Refusal(
                429, "concurrency", f"client '{client.name}' over its concurrency cap of "
                                    f"{cap} requests in flight", 1))
        rate = client.rate
        if rate is not None:
            client.bucket, wait = take(client.bucket, self.clock(), rate, client.burst)
            if wait:
                return self._refuse(client, model, Refusal(
                    429, "rate", f"client '{client.name}' over its rate limit of "
                                 f"{rate:g} req/s (burst {client.burst:g})", retry_after(wait)))
        if client.meters or mm:
            for m in (*client.meters, *(mm or ())):
                if m.unit == "requests":
                    m.used += 1
        client.inflight += 1
        mi = self.model_inflight
        mi[model] = mi.get(model, 0) + 1
        if self.cpu_metered and not self.tick_counts:
            now = self.clock()
            if now - self.tick_at >= self.tick_s:
                # the first request after a quiet spell: CPU burnt while idle is nobody's
                self.cpu_at, self.tick_at = self.cpu(), now
        return None

    def _refuse(self, client: ClientState, model: str, r: Refusal) -> Refusal:
        label = model if model in self.model_meters or model in self.stopped_models else ALL
        key = (client.name, label, r.reason)
        self.refusals[key] = self.refusals.get(key, 0) + 1
        return r

    def release(self, client: ClientState, model: str, usage: dict[str, float] | None = None
                ) -> None:
        """An admitted request ended; `usage` is what the server reported it used (tokens)."""
        client.inflight -= 1
        mi = self.model_inflight
        n = mi.get(model, 1) - 1
        if n > 0:
            mi[model] = n
        else:
            mi.pop(model, None)
        if usage:
            tokens = usage.get("tokens")
            if tokens:
                self._charge(client, model, "tokens", float(tokens))
        if self.cpu_metered:
            key = (client.name, model)
            self.tick_counts[key] = self.tick_counts.get(key, 0) + 1
            if self.clock() - self.tick_at >= self.tick_s:
                self.close_tick()

    def _charge(self, client: ClientState, model: str, unit: str, x: float) -> None:
        mm = self.model_meters.get(model, ())
        if not client.meters and not mm:
            return
        wall = self.wall()
        for m in (*client.meters, *mm):
            if m.unit == unit:
                m.roll(wall)
                m.used += x

    def close_tick(self) -> None:
        """Share the CPU burnt since the last tick among the requests that finished in it."""
        if not self.cpu_metered:
            return
        c = self.cpu()
        shares = apportion(c - self.cpu_at, self.tick_counts)
        self.cpu_at, self.tick_at = c, self.clock()
        self.tick_counts = {}
        for (name, model), s in shares.items():
            st = self.clients.get(name)
            if st is not None and s:
                self._charge(st, model, "core_seconds", s)

    # -- kill switches -------------------------------------------------------------------------

    def stop_model(self, model: str) -> None:
        if not re.match(NAME_PATTERN, model):
            raise KeyError(f"model name {model!r}: use 1-64 letters, digits, '.', '_' or '-'")
        self.stopped_models.add(model)
        self.released_models.discard(model)

    def release_model(self, model: str) -> None:
        if model in self.stopped_models:
            self.stopped_models.discard(model)
            self.released_models.add(model)

    def client(self, name: str) -> ClientState:
        st = self.clients.get(name)
        if st is None:
            raise KeyError(f"no client {name!r} is configured (known: "
                           f"{', '.join(sorted(self.clients))})")
        return st

    def inflight_of(self, kind: str, name: str) -> int:
        if kind == "models":
            return self.model_inflight.get(name, 0)
        return self.client(name).inflight

    # -- what is visible -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything an operator (GET /admin/governance) or the report reads."""
        self.close_tick()
        wall = self.wall()

        def meters(ms: list[Meter]) -> list[dict[str, Any]]:
            out = []
            for m in ms:
                m.roll(wall)
                out.append({"unit": m.unit, "period": m.period, "limit": m.limit,
                            "used": round(m.used, 6), "resets_at": utc_iso(m.end)})
            return out

        return {
            "clients": {n: {"rate": c.rate, "burst": c.burst if c.rate else None,
                            "max_concurrency": c.cap, "inflight": c.inflight,
                            "stopped": c.stopped, "budgets": meters(c.meters)}
                        for n, c in self.clients.items()},
            "models": {n: {"budgets": meters(ms), "inflight": self.model_inflight.get(n, 0)}
                       for n, ms in self.model_meters.items()},
            "stopped": {"models": sorted(self.stopped_models),
                        "clients": sorted(n for n, c in self.clients.items() if c.stopped)},
            "inflight": dict(self.model_inflight),
            "summary": self.summary(),
        }

    def summary(self) -> str:
        """One line for the sheet's governance cell."""
        return summary(self.config, sorted(self.stopped_models),
                       sorted(n for n, c in self.clients.items() if c.stopped))

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The Prometheus families, read from the state at scrape time."""
        self.close_tick()
        wall = self.wall()
        labels = ["client", "model", "unit", "period"]
        used = GaugeMetricFamily("scalelab_budget_used", "Burn of a cost budget in its current "
                                 "UTC window", labels=labels)
        limit = GaugeMetricFamily("scalelab_budget_limit", "A cost budget's limit per window",
                                  labels=labels)
        for m in self.meters:
            m.roll(wall)
            lv = [m.client, m.model, m.unit, m.period]
            used.add_metric(lv, m.used)
            limit.add_metric(lv, m.limit)
        refused = CounterMetricFamily("scalelab_governance_refusals", "Requests refused by "
                                      "governance", labels=["client", "model", "reason"])
        for (who, mo, r), n in sorted(self.refusals.items()):
            refused.add_metric([who, mo, r], n)
        stopped = GaugeMetricFamily("scalelab_governance_stopped", "Kill switch engaged (1) "
                                    "or released (0)", labels=["kind", "name"])
        for name in sorted(self.stopped_models | self.released_models):
            stopped.add_metric(["model", name], 1.0 if name in self.stopped_models else 0.0)
        for name, st in self.clients.items():
            stopped.add_metric(["client", name], 1.0 if st.stopped else 0.0)
        inflight = GaugeMetricFamily("scalelab_governance_inflight", "Admitted requests in "
                                     "flight per client", labels=["client"])
        for name, st in self.clients.items():
            inflight.add_metric([name], st.inflight)
        info = GaugeMetricFamily("scalelab_governance_info", "What governance this process "
                                 "enforces (the sheet's governance cell)", labels=["summary"])
        info.add_metric([self.summary()], 1.0)
        yield from (used, limit, refused, stopped, inflight, info)


class GovernorCollector(Collector):
    """Adapts a Governor to a prometheus-client registry."""

    def __init__(self, governor: Governor) -> None:
        self.governor = governor

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self.governor.collect()


def summary(config: GovernanceConfig | None, stopped_models: list[str],
            stopped_clients: list[str]) -> str:
    """'rate limits: 2 clients; budgets: requests/day default 1,000,000; kill switches: none
    engaged' (pure: the sheet's governance cell)."""
    if config is None:
        return "none configured"
    classes = [("default", config.default), *config.clients.items()]
    rated = [n for n, c in classes if c.rate is not None]
    capped = [n for n, c in classes if c.max_concurrency is not None]
    parts = []
    if rated:
        parts.append(f"rate limits: {len(rated)} client{'s' * (len(rated) != 1)}")
    if capped:
        parts.append(f"concurrency caps: {len(capped)} client{'s' * (len(capped) != 1)}")
    budgets = [f"{b.unit}/{b.period} {n} {b.limit:,.{0 if b.limit.is_integer() else 3}f}"
               for n, c in classes for b in c.budgets]
    budgets += [f"{b.unit}/{b.period} model {m} "
                f"{b.limit:,.{0 if b.limit.is_integer() else 3}f}"
                for m, mb in config.models.items() for b in mb.budgets]
    if budgets:
        parts.append("budgets: " + ", ".join(budgets))
    engaged = [f"model {m}" for m in stopped_models] + [f"client {c}" for c in stopped_clients]
    parts.append("kill switches: " + (", ".join(engaged) + " stopped" if engaged
                                      else "none engaged"))
    return "; ".join(parts)
