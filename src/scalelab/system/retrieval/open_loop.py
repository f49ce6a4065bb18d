"""The fixed-rate (open-loop) latency run at an index's operating point, grown chunk by chunk.

Queries are sent on a fixed schedule (i / rate) and latency counts from the scheduled send, so
a slow query delays the ones behind it, as it would in a server. The run's first chunk is one
pass over the questions. With latency objectives and a time allowance (`LatencyAllowance`, the
diagnose stage's share beyond its fixed work) it grows like a sized load level
(`diagnose.sizing`): after each chunk the latencies so far are decided against the objectives
by the verdict's own rule (`core.objectives.check_rows` on the record the bench writes: order
statistics of the recorded quantiles); while one is undecided the next chunk sends at least
what a decision needs (299 latencies for a p99) and otherwise as many as all chunks before
it, cut to what the run's allowance has left. Chunks merge exactly: their latencies are
concatenated and every quantile is read from all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.objectives import QUANTILE_OF, Check, Objective, check_rows
from scalelab.lab.core.records import Latency, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.system.retrieval.index import VectorIndex

"""The latency metrics a fixed-rate run records, by quantile."""


def percentiles(ms: np.ndarray) -> tuple[float, float, float]:
    p = np.percentile(ms, [50, 95, 99])
    return float(p[0]), float(p[1]), float(p[2])


def send(index: VectorIndex, q: np.ndarray, k: int, rate: float, n: int,
         offset: int = 0) -> np.ndarray:
    """Latencies (ms) of `n` queries sent at `rate` from now on, the questions taken in order
    from `offset` (wrapping). Past one pass over the questions the chunk stops when the index
    searches slower than the rate on average (its queue only grows: the first pass shows the
    backlog already, and more would only make the run longer). The index's own search time
    decides that, not the clock's lag behind the schedule, which a busy host's scheduler
    stretches without the index being slow."""
    gap = 1.0 / rate
    m = q.shape[0]
    lat = np.zeros(n)
    start = time.perf_counter()
    busy = 0.0
    sent = 0
    for i in range(n):
        if i >= m and busy / i > gap:
            break
        due = start + i * gap
        while (now := time.perf_counter()) < due:
            time.sleep(min(due - now, 0.001))
        j = (offset + i) % m
        t0 = time.perf_counter()
        index.search(q[j:j + 1], k)
        done = time.perf_counter()
        busy += done - t0
        lat[i] = (done - due) * 1e3
        sent += 1
    return lat[:sent]


def summary(lat: np.ndarray, rate: float) -> dict[str, float]:
    """What a record keeps of a run: its rate, quantiles, maximum and query count."""
    p50, p95, p99 = percentiles(lat)
    return {"rate_qps": rate, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
            "max_ms": float(lat.max()), "queries": float(lat.size)}


def open_loop(index: VectorIndex, q: np.ndarray, k: int, rate: float,
              queries: int = 0) -> dict[str, float]:
    """One fixed-rate run of max(one pass, `queries`) queries (see `send`)."""
    return summary(send(index, q, k, rate, max(q.shape[0], queries)), rate)


def parse_slo(items: Sequence[str]) -> list[Objective]:
    """['p99<20ms'] -> [Objective(p99_ms ≤ 20)]: the latency limits a run is sized to decide
    (core/objectives.py's `--slo` grammar, latency terms only)."""
    out = []
    for item in items:
        o = Objective.from_slo(item.strip())
        if o.quantile is None:
            raise BadUsageError(f"--latency-slo {item!r}: name a latency quantile, e.g. "
                                "p99<20ms")
        out.append(o)
    return out


def _open(lat: np.ndarray, objectives: Sequence[Objective]) -> list[Check]:
    """The checks the verdict's rule leaves undecided on these latencies (a record with their
    quantiles and count, as the bench writes one)."""
    if not objectives:
        return []
    s = summary(lat, 1.0)
    rec = make_record(experiment="sizing", stage="retrieval", variable="corpus_multiple",
                      level=1.0, latency=Latency(p50_ms=s["p50_ms"], p95_ms=s["p95_ms"],
                                                 p99_ms=s["p99_ms"], max_ms=s["max_ms"]),
                      extras={"samples": int(lat.size), "samples_unit": "queries"})
    return [c for c in check_rows(build_sheet([rec]), list(objectives))
            if c.outcome == "undecided"]


def undecided(lat: np.ndarray, objectives: Sequence[Objective]) -> list[str]:
    """'<objective>: <what deciding it needs>' for each objective the verdict's rule leaves
    undecided on these latencies."""
    return [f"{c.objective.label}: {c.decision.need}" for c in _open(lat, objectives)]


def needs(lat: np.ndarray, objectives: Sequence[Objective]) -> tuple[list[int], bool]:
    """The latencies each undecided objective's rule needs in all where it gives a count
    (299 for a p99 measured on fewer), and whether some undecided one gives none (measured
    on enough, its bound straddling the limit: more may still decide it)."""
    got = [least if (c.decision.n or 0) < (least := quantile_requests_needed(
        QUANTILE_OF[c.objective.metric])) else None for c in _open(lat, objectives)]
    return [n for n in got if n is not None], any(n is None for n in got)


def paid_count(counts: list[int], *, have: int, left_s: float, rate: float) -> int | None:
    """The largest count of latencies `left_s` pays at `rate` beyond the `have` measured
    (pure): 30 measured, 2 s at 100 queries/s pay a p95's 59 (29 more), not a p99's 299 (269
    more); None when none is paid."""
    paid = [n for n in counts if max(0, n - have) <= left_s * rate]
    return max(paid) if paid else None


def next_chunk(measured: int, least: int, left_s: float, rate: float, first: int) -> int:
    """Queries of a run's next chunk: nothing is decided under `least` latencies, so at least
    what reaches it, else as many as measured so far (the doubling of diagnose.sizing), cut to
    what `left_s` pays at `rate`; 0 (stop) when that is under half the first pass."""
    n = min(max(measured, least - measured), int(left_s * rate))
    return n if n >= first / 2 else 0


UNPAID = "share cannot pay the samples still needed"
"""Why a run stopped with its share not spent: every undecided objective needs a count of
latencies the share cannot pay (`diagnose.sizing.UNPAID`'s words)."""


@dataclass(kw_only=True)
class LatencyAllowance:
    """The seconds the bench's fixed-rate runs may take beyond their first passes, handed out
    as they run: what is left over the runs still to come, so time a decided run did not use
    goes to the later ones."""

    total_s: float
    """Extra seconds for every run together (the stage's share beyond its fixed work)."""
    runs: int
    """How many fixed-rate runs the bench makes (levels x indexes)."""
    spent_s: float = 0.0
    done: int = 0

    def next_share(self) -> float:
        left = max(1, self.runs - self.done)
        self.done += 1
        return max(0.0, (self.total_s - self.spent_s) / left)


def sized_open_loop(index: VectorIndex, q: np.ndarray, k: int, rate: float, *,
                    objectives: Sequence[Objective], share_s: float,
                    clock: Callable[[], float] = time.monotonic
                    ) -> tuple[dict[str, float], dict[str, Any]]:
    """The run's summary and how it was sized (the `sizing` extras of diagnose.sizing: chunks,
    samples, spent_s, share_s, stopped, undecided): one pass, then chunks while an objective
    is undecided and `share_s` (seconds beyond the first pass) pays for at least half a pass.
    A chunk reaches the largest count the share pays at `rate` (`paid_count`); when every
    undecided objective needs a count it cannot pay (a p99's 299 at 100 queries/s with under
    2.69 s left after a 30-query pass) the run stops (`UNPAID`), its time left to the runs
    after it (`LatencyAllowance`), rather than spent on latencies that cannot decide it."""
    t0 = clock()
    lat = send(index, q, k, rate, q.shape[0])
    first_s = clock() - t0
    chunks = 1
    pending = undecided(lat, objectives)
    stopped = "decided"
    while pending:
        left = share_s - (clock() - t0 - first_s)
        counts, open_ended = needs(lat, objectives)
        least = paid_count(counts, have=lat.size, left_s=left, rate=rate)
        if least is None and counts and not open_ended:
            stopped = UNPAID
            break
        n = next_chunk(lat.size, least or 0, left, rate, q.shape[0])
        if not n:
            stopped = "time share spent"
            break
        lat = np.concatenate([lat, send(index, q, k, rate, n, offset=lat.size)])
        chunks += 1
        pending = undecided(lat, objectives)
    sizing = {"chunks": chunks, "samples": int(lat.size), "spent_s": round(clock() - t0, 3),
              "share_s": round(first_s + share_s, 3), "stopped": stopped, "undecided": pending}
    return summary(lat, rate), sizing
