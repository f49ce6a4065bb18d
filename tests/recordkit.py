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


def _lat(p95: float) -> Latency:
    return Latency(p50_ms=p95 / 2, p90_ms=p95 * 0.9, p95_ms=p95, p99_ms=p95 * 1.5,
                   p999_ms=p95 * 2, max_ms=p95 * 3)


def demo_records() -> list[Record]:
    """A record set shaped like `make demo`'s seven stages (the default objectives decide
    them): data holds to 10×, train first misses at 2× (efficiency 0.63, 51% all-reduce),
    serve is undecided at 10× on availability (1,180 requests a level at ~98 requests/s),
    llm holds, model holds, retrieval misses recall on no candidate, online holds."""
    out: list[Record] = []
    for k in (1, 2, 5, 10):
        out.append(rec("data", "scale", k, rate=70354.0, rate_unit="rows/s", wall_s=4.8 * k,
                       input_volume=336776.0 * k, input_unit="rows", failure_rate=0.0149,
                       peak_memory_bytes=int(3.399e8 * k ** 0.5),
                       extras={"cpu_busy_cores": 1.94, "samples": 336776 * k}))
    for n, r in ((1, 1000.0), (2, 1260.0), (4, 1300.0)):
        out.append(rec("train", "workers", n, rate=r, rate_unit="samples/s", wall_s=30.0,
                       series="strong", extras={"comm_share": 0.51 if n > 1 else 0.0,
                                                "cpu_busy_cores": 1.6 * min(n, 2) / 2}))
    for lvl in (10, 20, 50, 100):
        out.append(make_record(
            experiment="t", stage="serve", variable="rate", level=lvl, rate=lvl * 0.98,
            rate_unit="requests/s", wall_s=1180 / (lvl * 0.98), latency=_lat(8 + lvl / 10),
            failure_rate=0.0, machine=M,
            extras={"samples": 1180, "series": "batching=off", "cpu_busy_cores": 0.8}))
    for lvl in (1, 2, 5, 10):
        out.append(make_record(
            experiment="t", stage="llm", variable="streams", level=lvl, rate=40.0 * lvl,
            rate_unit="tokens/s", wall_s=30.0, latency=_lat(300.0 + 20 * lvl),
            failure_rate=0.0, machine=M,
            extras={"samples": 700, "series": "continuous", "tpot_p50_ms": 30.0,
                    "tpot_p90_ms": 40.0, "tpot_p95_ms": 45.0, "tpot_p99_ms": 60.0}))
    for i, (variant, d_f1, worst, p95) in enumerate((("fp32", 0.0, 0.0, 1.2),
                                                      ("int8", -0.4, -2.0, 0.8))):
        out.append(make_record(
            experiment="t", stage="model", variable="variant", level=float(i),
            rate=9000.0, rate_unit="predictions/s", latency=_lat(p95), machine=M,
            quality={"macro_f1_delta_points": d_f1, "worst_class_f1_delta_points": worst},
            extras={"series": variant, "samples": 3000}))
    for lvl in (1, 2, 5, 10):
        for series, recall, mem in (("exact", 1.0, 1.0), ("faiss:HNSW32", 0.97, 1.2)):
            out.append(make_record(
                experiment="t", stage="retrieval", variable="corpus_multiple", level=lvl,
                rate=500.0 / lvl, rate_unit="queries/s", wall_s=2.0 * lvl,
                latency=_lat(2.0 * lvl), failure_rate=0.0, machine=M,
                quality={"recall_at_10": recall},
                extras={"series": series, "samples": 3000, "memory_vs_raw": mem,
                        "new_doc_to_answerable_s": 0.2}))
    for lvl in (1, 3, 30):
        out.append(make_record(
            experiment="t", stage="online", variable="updates_per_30d", level=lvl,
            rate=5000.0, rate_unit="events/s ingested", wall_s=10.0, failure_rate=0.01,
            machine=M, quality={"macro_f1": 0.41},
            extras={"series": "fixed", "samples": 50000}))
    return out
