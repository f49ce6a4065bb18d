"""Hand-made records with known answers, shared by the core and report tests."""

from scalelab.lab.core.machine import Machine
from scalelab.lab.core.records import Latency, Record, make_record

M = Machine(cores=2, memory_bytes=24 * 2**30, device="cpu: test", hostname="t")


def rec(
    stage: str,
    variable: str,
    level: float,
    *,
    repeat: int = 0,
    rate: float | None = None,
    p95: float | None = None,
    series: str | None = None,
    **kw: object,
) -> Record:
    extras = dict(kw.pop("extras", {}) or {})  # type: ignore[call-overload]
    if series is not None:
        kw["series"] = series
    lat = Latency(p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95 * 2) if p95 is not None else None
    return make_record(
        experiment="t",
        stage=stage,
        variable=variable,
        level=level,
        repeat=repeat,
        rate=rate,
        latency=lat,
        machine=M,
        extras=extras,
        **kw,
    )  # type: ignore[arg-type]


def serve_records() -> list[Record]:
    out = []
    # Batching off: holds 50 and 100 req/s, then the queue builds (served < offered, p95 up).
    for lvl, served, p95 in ((50, 50, 8), (100, 99, 20), (250, 140, 400), (500, 141, 2000)):
        for rep in range(2):
            out.append(
                rec("serve", "rate", lvl, repeat=rep, rate=served, p95=p95, series="batching=off",
                    extras={"samples": 1000})
            )
    for lvl, served, p95 in ((50, 50, 6), (100, 100, 9), (250, 249, 30), (500, 300, 900)):
        out.append(rec("serve", "rate", lvl, rate=served, p95=p95, series="batching=on",
                       extras={"samples": 1000}))
    return out
