"""The limiting resource: what the measured signals of a stage's rows say saturated, each
conclusion citing its number (busy cores against the cores, memory against RAM, queue growth, the
communication share of a step, spill, I/O wait, the Karp–Flatt serial fraction, a resource sweep
past the machine's cores). Pure: rows in, evidence out; the verdict and the sheet read it."""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.lab.core.laws import karp_flatt
from scalelab.lab.core.server_limits import server_finding
from scalelab.lab.core.sheet import COMM_HIGH, CPU_BUSY, IOWAIT_HIGH, MEMORY_HIGH, SheetRow
from scalelab.lab.core.units import format_bytes


@dataclass(frozen=True, kw_only=True)
class Evidence:
    resource: str
    detail: str


RESOURCE_VARIABLES = ("workers", "nproc", "replicas", "processes", "threads")
"""Variables that ask the machine for one core each: above the core count they share cores."""


def oversubscription(rows: list[SheetRow], cores: int) -> Evidence | None:
    """The hardware ceiling of a resource sweep: its highest level above the machine's cores,
    e.g. '4 workers on 2 cores: oversubscribed ×2'; None when every level fits."""
    if not rows or cores <= 0 or rows[0].variable not in RESOURCE_VARIABLES:
        return None
    top = max(r.level for r in rows)
    if top <= cores:
        return None
    over = sorted({r.level for r in rows if r.level > cores})
    var = rows[0].variable
    return Evidence(
        resource="cores",
        detail=f"{top:g} {var} on {cores} cores: oversubscribed ×{top / cores:.3g}"
        + (f" (levels {', '.join(f'{x:g}' for x in over)} exceed the cores; what they "
           "measure is sharing, not scaling)" if len(over) > 1 else
           " (what it measures is sharing, not scaling)"),
    )


def infer_limits(rows: list[SheetRow], *, cores: int, memory_bytes: int) -> list[Evidence]:
    """Signals from the measurements, strongest first; each cites its number and level.

    Only measured signals count (never a label a stage wrote): CPU busy cores of the stage's
    process tree, peak memory against RAM, queue growth, the communication share, disk spill,
    I/O wait and the Karp–Flatt serial fraction. Nothing past its threshold: one line saying
    what was measured, or that nothing was."""
    ev: list[Evidence] = []
    if not rows:
        return ev
    rows = sorted(rows, key=lambda r: r.level)
    ceiling = oversubscription(rows, cores)
    if ceiling is not None:
        ev.append(ceiling)
    server, server_seen = server_evidence(rows)
    ev += server
    last = rows[-1]
    at = f"at {last.variable}={last.level:g}"
    busy = last.resources.cpu_busy_cores
    if busy is not None and busy >= CPU_BUSY * cores:
        ev.append(Evidence(resource="cpu", detail=f"{busy:.2f} of {cores} cores busy {at}"))
    mem = (
        last.peak_memory_bytes / memory_bytes
        if last.peak_memory_bytes and memory_bytes
        else None
    )
    if mem is not None and last.peak_memory_bytes and mem >= MEMORY_HIGH:
        ev.append(
            Evidence(
                resource="memory",
                detail=f"peak {format_bytes(last.peak_memory_bytes)} = {mem:.0%} of RAM {at}",
            )
        )
    # Queue growth: offered load (the level, for rate sweeps) above what was served, latency up.
    if last.variable in ("rate", "arrival_rate") and last.rate is not None and rows[0].p95_ms:
        served = last.rate / last.level if last.level else 1.0
        if last.p95_ms is not None and served < 0.95 and last.p95_ms >= 3 * rows[0].p95_ms:
            ev.append(
                Evidence(
                    resource="queue",
                    detail=(
                        f"offered {last.level:g}/s, served {last.rate:.4g}/s ({served:.0%}); p95 "
                        f"{rows[0].p95_ms:.1f} → {last.p95_ms:.1f} ms: "
                        "arrivals exceed service capacity"
                    ),
                )
            )
    comm = last.resources.comm_share
    if comm is not None and comm >= COMM_HIGH:
        ev.append(
            Evidence(
                resource="communication",
                detail=f"{comm:.0%} of step time in gradient all-reduce {at}",
            )
        )
    spill = last.resources.spilled_bytes
    if spill:
        ev.append(Evidence(resource="disk spill", detail=f"{format_bytes(spill)} spilled {at}"))
    iow = last.resources.iowait_share
    if iow is not None and iow >= IOWAIT_HIGH:
        ev.append(
            Evidence(resource="i/o", detail=f"{iow:.0%} of the machine's CPU time in I/O wait {at}")
        )
    kf = _karp_flatt_trend([r for r in rows if ceiling is None or r.level <= cores])
    if kf is not None:
        ev.append(Evidence(resource="serial fraction", detail=kf))
    ev += client_inference(rows)
    if not [e for e in ev if e is not ceiling]:
        seen = [
            *server_seen,
            *([f"{busy:.2f} of {cores} cores busy"] if busy is not None else []),
            *([f"peak memory {mem:.0%} of RAM"] if mem is not None else []),
            *([f"{iow:.0%} I/O wait"] if iow is not None else []),
            *([f"{comm:.0%} of step time communicating"] if comm is not None else []),
        ]
        if seen:
            ev.append(Evidence(resource="none saturated", detail=", ".join(seen) + f" {at}"))
        else:
            ev.append(
                Evidence(
                    resource="not measured",
                    detail="the stage recorded no CPU, memory, I/O, queue or communication signal",
                )
            )
    return ev


PLATEAU_VARIABLES = ("concurrency", "clients", "streams", "connections")
"""Variables that set the requests in flight: a served rate flat across them is a slot count."""
FLAT = 0.1
"""A rate within this share of the largest is flat."""


def server_evidence(rows: list[SheetRow]) -> tuple[list[Evidence], list[str]]:
    """The server's own signals: (its saturated findings, each at the lowest level it shows
    and with its number; what it showed unsaturated at the highest level read)."""
    read = [r for r in rows if r.server is not None]
    if not read:
        return [], []
    out: list[Evidence] = []
    refusing = next((r for r in read if r.server and r.server.refused), None)
    if refusing is not None:
        out.append(_admission(rows, refusing))
    said = {e.resource for e in out}
    for r in read:
        assert r.server is not None
        f = server_finding(r.server.model_copy(update={"refused": None}))
        if f is not None and f.saturated and f.resource not in said:
            said.add(f.resource)
            out.append(Evidence(resource=f.resource,
                                detail=f"{f.detail} at {r.variable}={r.level:g}"))
    if out:
        return out, []
    top = read[-1]
    assert top.server is not None
    f = server_finding(top.server)
    return [], ([f"server {f.detail}"] if f is not None else [])


def _admission(rows: list[SheetRow], first: SheetRow) -> Evidence:
    """Refusals from a level on: the level below took everything, this one turned work away."""
    assert first.server is not None
    f = server_finding(first.server)
    assert f is not None
    below = [r for r in rows if r.level < first.level]
    before = (f"none refused at {below[-1].variable}={below[-1].level:g}; "
              if below and below[-1].server is not None and not below[-1].server.refused
              else "")
    served = (f"; served {first.rate:.3g} {first.rate_unit or '/s'} there"
              if first.rate is not None else "")
    return Evidence(resource="admission",
                    detail=f"{before}{f.detail} at {first.variable}={first.level:g}{served}")


def client_inference(rows: list[SheetRow]) -> list[Evidence]:
    """What the client's own records show of a server that published nothing, said as an
    inference: a served rate flat past N in flight (about N slots), and then TTFT growing with
    each extra stream (requests queue in front of the engine)."""
    if not rows or rows[0].variable not in PLATEAU_VARIABLES:
        return []
    cut = _one_at_a_time(rows)
    if cut is not None:
        return [cut]
    pts = [(r.level, r.rate, r) for r in rows if r.rate and r.level > 0]
    if len(pts) < 3:
        return []
    n0, x0, _ = pts[0]
    top = max(x for _, x, _ in pts)
    knee, xk, rk = next(p for p in pts if p[1] >= (1 - FLAT) * top)
    if knee * 1.5 > pts[-1][0] or pts[-1][1] < (1 - FLAT) * top:
        return []  # still growing, or not flat over a wide enough span to say
    slots = max(1, round(top / (x0 / n0)))
    unit = rk.rate_unit or "/s"
    one = "one request at a time" if slots == 1 else f"about {slots} slots"
    out = [Evidence(resource="slots (inferred)",
                    detail=f"{one}: {xk:.3g} {unit} at {knee:g} in flight, "
                           f"{pts[-1][1]:.3g} at {pts[-1][0]:g} (flat past {knee:g}; "
                           f"{x0:.3g} at {n0:g}) — inferred from the client's records")]
    growth = _ttft_growth(rows, knee)
    if growth is not None:
        out.append(growth)
    return out


CUT_SHARE = 0.05
"""Streams cut short or empty at this share of a level, where one stream alone had none: the
server interrupts a running request for a new one."""


def _one_at_a_time(rows: list[SheetRow]) -> Evidence | None:
    def share(r: SheetRow) -> float:
        s = r.server
        return (s.cut_streams or 0) / s.requests if s is not None and s.requests else 0.0

    first = rows[0]
    if first.level != 1 or share(first) > 0:
        return None
    hit = next((r for r in rows[1:] if share(r) >= CUT_SHARE), None)
    if hit is None or hit.server is None:
        return None
    return Evidence(resource="one request at a time (inferred)",
                    detail=f"no stream cut short at {first.variable}=1; {hit.server.cut_streams} "
                           f"of {hit.server.requests} streams ({share(hit):.0%}) cut short or "
                           f"empty at {hit.variable}={hit.level:g}: a new request interrupts "
                           "the running one — inferred from the client's records")


def _ttft_growth(rows: list[SheetRow], knee: float) -> Evidence | None:
    past = [r for r in rows if r.level >= knee and r.p50_ms is not None]
    if len(past) < 2 or rows[0].extras.get("latency_is") != "ttft":
        return None
    a, b = past[0], past[-1]
    assert a.p50_ms is not None and b.p50_ms is not None
    per = (b.p50_ms - a.p50_ms) / (b.level - a.level)
    service = rows[0].extras.get("e2e_p50_ms")
    if not isinstance(service, int | float) or per <= 0.2 * service / max(knee, 1.0):
        return None
    return Evidence(resource="queue (inferred)",
                    detail=f"TTFT p50 {a.p50_ms:.3g} → {b.p50_ms:.3g} ms from {a.level:g} to "
                           f"{b.level:g} streams: +{per:.3g} ms per extra stream (one stream "
                           f"alone takes {service:.3g} ms): requests wait in front of the "
                           "engine — inferred from the client's records")


def _karp_flatt_trend(rows: list[SheetRow]) -> str | None:
    """Karp–Flatt over a resource sweep (workers, replicas): rising e means overhead grows."""
    if rows[0].variable not in ("workers", "nproc", "replicas", "processes"):
        return None
    pts = [(r.level, r.rate) for r in rows if r.rate]
    if len(pts) < 2 or pts[0][0] <= 0:
        return None
    n0, x0 = pts[0]
    assert x0 is not None
    es = []
    for n, x in pts[1:]:
        p = n / n0
        if p > 1 and x:
            es.append((n, karp_flatt(x / x0, p)))
    if not es:
        return None
    text = ", ".join(f"e={e:.2f} at {n:g}" for n, e in es)
    if len(es) >= 2 and es[-1][1] > es[0][1] + 0.05:
        return f"Karp–Flatt serial fraction rises ({text}): overhead grows with workers"
    if es[-1][1] > 0.2:
        return f"Karp–Flatt serial fraction {text}: a large serial phase"
    return None
