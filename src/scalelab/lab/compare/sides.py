"""What is compared: each side's records (a records file, or a run or report directory), grouped
by (stage, series, variable, level), and the evidence of each metric at a level on both sides.

Latency quantiles rest on the records' HdrHistograms (`Record.histograms`:
`load` keeps one, "latency", `load llm` one per metric), merged over
repeats, or each repeat's quantile with 3+ repeats a side (RUNS_AS_UNITS); a record without
one falls back to its recorded quantiles (p50…max): over repeats when both sides have
2 or more, by the verdict's bracketing of recorded ranks when each has one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scalelab.lab.compare.intervals import Latencies, Repeats
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.core.sheet import sample_count, series_of
from scalelab.lab.load.histogram import LatencyHistogram

RECORDS_NAME = "records.jsonl"
"""What a diagnose run (and its report) directory keeps its records in (diagnose.run.RECORDS)."""

QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
"""The latency quantiles compared (each one more comparison for the Holm correction)."""

RUNS_AS_UNITS = 3
"""With this many repeats a side, a quantile is compared over repeats (each repeat's own
quantile), so the drift between runs counts; with fewer, over the merged latencies by order
statistics, which hold the sampling noise within a run only."""

_FIELDS = {0.5: "p50_ms", 0.95: "p95_ms", 0.99: "p99_ms"}

Key = tuple[str, str, str, float]
"""(stage, series, variable, level)."""


def read_side(path: Path) -> list[Record]:
    """The records behind A or B: a .jsonl file, or a directory holding records.jsonl (a
    diagnose run or report) or exactly one .jsonl file (a load run's --records folder)."""
    if path.is_dir():
        found = path / RECORDS_NAME
        if not found.is_file():
            files = sorted(path.glob("*.jsonl"))
            if len(files) != 1:
                raise BadInputError(
                    f"{path}: no {RECORDS_NAME} and {len(files)} .jsonl files; pass the "
                    "records file itself")
            found = files[0]
        path = found
    elif not path.is_file():
        raise BadInputError(f"{path} does not exist; pass a records .jsonl file or a run "
                            "directory holding records.jsonl")
    records = read_records(path)
    if not records:
        raise BadInputError(f"{path} holds no records; pass the records of a finished run")
    return records


def group(records: list[Record]) -> dict[Key, list[Record]]:
    out: dict[Key, list[Record]] = defaultdict(list)
    for r in records:
        out[(r.stage, series_of(r), r.variable, r.level)].append(r)
    return dict(out)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """One metric at one level, both sides: exactly one of quantile, repeats, failures."""

    metric: str
    lower_is_better: bool
    q: float | None = None
    a_lat: Latencies | None = None
    b_lat: Latencies | None = None
    repeats: Repeats | None = None
    failures: tuple[int, int, int, int] | None = None
    """(k_A, n_A, k_B, n_B)."""
    runs: Repeats | None = None
    """The metric's value in each run of each side (`run_values`), for an interval over runs
    with the spread between runs of calibration records (calibration.py); None where a run
    lacks it."""


def _slices(r: Record, name: str) -> list[str]:
    return r.slices.get(name, [])


def _merged(recs: list[Record], name: str) -> Latencies | None:
    h = LatencyHistogram()
    slices: list[str] = []
    for r in recs:
        blob = r.histograms.get(name)
        if blob is None:
            return None
        h.add_blob(blob)
        slices += _slices(r, name)
    if h.count == 0:
        return None
    values, counts = h.buckets_ms()
    # Slices count only when every repeat kept them (else their spread would miss a run).
    whole = all(_slices(r, name) for r in recs)
    return Latencies(values_ms=values, counts=counts, n=h.count,
                     slices=tuple(slices) if whole else ())


def _recorded(r: Record) -> dict[float, float] | None:
    if r.latency is None:
        return None
    got = {q: getattr(r.latency, f) for q, f in _FIELDS.items()}
    return {q: float(v) for q, v in got.items() if v is not None} or None


def _latency_evidence(a: list[Record], b: list[Record]) -> list[Evidence]:
    names = sorted(set.intersection(*(set(r.histograms) for r in a + b)))
    out: list[Evidence] = []
    if names and len(a) >= RUNS_AS_UNITS and len(b) >= RUNS_AS_UNITS:
        for name in names:
            per = [[_merged([r], name) for r in side] for side in (a, b)]
            for q in QUANTILES:
                va, vb = ([x.quantile(q) for x in side if x is not None] for side in per)
                out.append(Evidence(metric=f"{name} p{q * 100:g}", lower_is_better=True,
                                    repeats=Repeats(a=tuple(va), b=tuple(vb))))
        return out
    for name in names:
        la, lb = _merged(a, name), _merged(b, name)
        if la is not None and lb is not None:
            out += [Evidence(metric=f"{name} p{q * 100:g}", lower_is_better=True, q=q,
                             a_lat=la, b_lat=lb) for q in QUANTILES]
    if names:
        return out
    ra, rb = [_recorded(r) for r in a], [_recorded(r) for r in b]
    if any(x is None for x in ra + rb):
        return out
    for q in QUANTILES:
        va = [x[q] for x in ra if x is not None and q in x]
        vb = [x[q] for x in rb if x is not None and q in x]
        if len(va) != len(a) or len(vb) != len(b):
            continue
        metric = f"latency p{q * 100:g}"
        if len(a) >= 2 and len(b) >= 2:
            out.append(Evidence(metric=metric, lower_is_better=True,
                                repeats=Repeats(a=tuple(va), b=tuple(vb))))
        elif len(a) == 1 and len(b) == 1:
            na, nb = _latency_n(a[0]), _latency_n(b[0])
            if na and nb:
                out.append(Evidence(
                    metric=metric, lower_is_better=True, q=q,
                    a_lat=_recorded_only(ra[0], na), b_lat=_recorded_only(rb[0], nb)))
    return out


def _latency_n(r: Record) -> int | None:
    n = sample_count(r)
    return None if n is None else n - r.failures


def _recorded_only(rec: dict[float, float] | None, n: int) -> Latencies:
    assert rec is not None
    return Latencies(values_ms=np.zeros(0), counts=np.zeros(0, dtype=np.int64), n=n,
                     recorded=rec)


def run_values(r: Record) -> dict[str, float]:
    """One run's value of each metric, named as `evidence` names it: each histogram's
    quantiles (the recorded ones without histograms) and the rate."""
    out: dict[str, float] = {}
    for name in r.histograms:
        lat = _merged([r], name)
        if lat is not None:
            out |= {f"{name} p{q * 100:g}": lat.quantile(q) for q in QUANTILES}
    rec = _recorded(r) if not r.histograms else None
    out |= {f"latency p{q * 100:g}": v for q, v in (rec or {}).items()}
    if r.rate is not None:
        out[f"rate ({r.rate_unit or 'per s'})"] = r.rate
    return out


def _with_runs(ev: Evidence, a: list[dict[str, float]], b: list[dict[str, float]]) -> Evidence:
    if ev.failures is not None or not all(ev.metric in v for v in a + b):
        return ev
    return replace(ev, runs=Repeats(a=tuple(v[ev.metric] for v in a),
                                    b=tuple(v[ev.metric] for v in b)))


def evidence(a: list[Record], b: list[Record]) -> list[Evidence]:
    """Every metric both sides measured at one level."""
    va, vb = [run_values(r) for r in a], [run_values(r) for r in b]
    return [_with_runs(ev, va, vb) for ev in _evidence(a, b)]


def _evidence(a: list[Record], b: list[Record]) -> list[Evidence]:
    out = _latency_evidence(a, b)
    ra = [r.rate for r in a if r.rate is not None]
    rb = [r.rate for r in b if r.rate is not None]
    if len(ra) == len(a) and len(rb) == len(b):
        unit = a[0].rate_unit or "per s"
        out.append(Evidence(metric=f"rate ({unit})", lower_is_better=False,
                            repeats=Repeats(a=tuple(ra), b=tuple(rb))))
    na = [sample_count(r) for r in a]
    nb = [sample_count(r) for r in b]
    if all(n is not None for n in na + nb):
        ka, kb = sum(r.failures for r in a), sum(r.failures for r in b)
        if ka + kb > 0:  # no failures on either side: nothing to compare
            out.append(Evidence(metric="failure rate", lower_is_better=True, failures=(
                ka, sum(n for n in na if n is not None), kb, sum(n for n in nb if n is not None))))
    return out
