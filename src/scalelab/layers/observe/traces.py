"""Reading span files: traces assembled, the slowest drawn as waterfalls, p99 attributed to spans.

Input is what `web.trace`'s JSON Lines exporter writes, one span per line (trace_id, span_id,
parent_id, name, start_ns, end_ns, attributes, status, service); several files (one per server
of a path) may be read together, since a trace keeps its id across servers.

Attribution: of the traces whose end-to-end time is at or above the p99 (nearest rank), where
did the time go? Each span's *self* time is its duration minus the union of its children's
intervals (clipped to it), so nested spans are not counted twice and the self times of one
well-nested trace add up to its root's duration; the shares are summed per span name over
the tail. A root's own self time is whatever no child covers (hand-offs, waiting to be woken).
Everything here but `read_spans` is pure and tested with exact numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
FORMAT_HINT = "each line must be one span as `--trace-out` writes it"


@dataclass(frozen=True, kw_only=True)
class SpanRec:
    """One finished span."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status: str = "unset"
    service: str | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _field(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise BadInputError(f"{where}: field {key!r} is missing; {FORMAT_HINT}")
    return doc[key]


def parse_span(text: str, where: str) -> SpanRec:
    """One line; BadInputError naming `where` (FILE:LINE) and the field at fault."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInputError(f"{where}: not JSON ({e.msg} at column {e.colno}); "
                            f"{FORMAT_HINT}") from None
    if not isinstance(doc, dict):
        raise BadInputError(f"{where}: a JSON {type(doc).__name__}, not an object; {FORMAT_HINT}")
    trace_id, span_id = _field(doc, "trace_id", where), _field(doc, "span_id", where)
    parent = doc.get("parent_id")
    if not isinstance(trace_id, str) or not _HEX32.match(trace_id):
        raise BadInputError(f"{where}: trace_id {trace_id!r} is not 32 lowercase hex digits")
    for key, v in (("span_id", span_id), ("parent_id", parent)):
        if (v is not None or key == "span_id") and (not isinstance(v, str)
                                                    or not _HEX16.match(v)):
            raise BadInputError(f"{where}: {key} {v!r} is not 16 lowercase hex digits")
    name = _field(doc, "name", where)
    if not isinstance(name, str) or not name:
        raise BadInputError(f"{where}: name must be a non-empty string")
    start, end = _field(doc, "start_ns", where), _field(doc, "end_ns", where)
    for key, v in (("start_ns", start), ("end_ns", end)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadInputError(f"{where}: {key} {v!r} must be a non-negative integer of "
                                "nanoseconds")
    if end < start:
        raise BadInputError(f"{where}: end_ns {end} is before start_ns {start}")
    attrs = doc.get("attributes") or {}
    if not isinstance(attrs, dict):
        raise BadInputError(f"{where}: attributes must be an object")
    return SpanRec(trace_id=trace_id, span_id=span_id, parent_id=parent, name=name,
                   start_ns=start, end_ns=end, attributes=attrs,
                   status=str(doc.get("status", "unset")), service=doc.get("service"))


def read_spans(paths: Iterable[Path]) -> list[SpanRec]:
    """Every span in the files, in file order; blank lines skipped."""
    out: list[SpanRec] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise BadInputError(f"{path}: no such span file; write one with "
                                "`scalelab serve --trace-out FILE.jsonl`") from None
        except UnicodeDecodeError as e:
            raise BadInputError(f"{path}: not UTF-8 text ({e.reason}); {FORMAT_HINT}") from None
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                out.append(parse_span(line, f"{path}:{i}"))
    return out


@dataclass(frozen=True, kw_only=True)
class Trace:
    """The spans sharing one trace id, sorted by start time."""

    trace_id: str
    spans: tuple[SpanRec, ...]

    @property
    def start_ns(self) -> int:
        return min(s.start_ns for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.spans)

    @property
    def duration_ns(self) -> int:
        """End to end: first span's start to last span's end."""
        return self.end_ns - self.start_ns

    def children(self) -> dict[str | None, list[SpanRec]]:
        """Parent span id -> its children in start order; spans whose parent is not in the
        trace (a client's span, or one lost) sit under None, as roots."""
        ids = {s.span_id for s in self.spans}
        out: dict[str | None, list[SpanRec]] = defaultdict(list)
        for s in self.spans:
            out[s.parent_id if s.parent_id in ids else None].append(s)
        return out


def assemble(spans: Iterable[SpanRec]) -> list[Trace]:
    """Group by trace id (a span repeated in two files counts once); traces in first-seen
    order."""
    by: dict[str, dict[str, SpanRec]] = {}
    for s in spans:
        by.setdefault(s.trace_id, {}).setdefault(s.span_id, s)
    return [Trace(trace_id=t, spans=tuple(sorted(d.values(), key=lambda s: (s.start_ns,
                                                                            -s.end_ns))))
            for t, d in by.items()]


def covered_ns(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of `intervals` clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None and cur_a is not None:
        total += cur_b - cur_a
    return total


def self_times(trace: Trace) -> dict[str, int]:
    """span id -> its duration minus what its children cover (ns)."""
    kids = trace.children()
    return {s.span_id: s.duration_ns - covered_ns(((c.start_ns, c.end_ns)
                                                   for c in kids.get(s.span_id, ())),
                                                  s.start_ns, s.end_ns)
            for s in trace.spans}


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank (a value that occurred: no interpolation)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    k = max(1, math.ceil(q * len(ordered)))
    return ordered[k - 1]


@dataclass(frozen=True, kw_only=True)
class Share:
    name: str
    self_ms: float
    """Summed over the tail's traces."""
    share: float
    """Of all self time in the tail, in [0, 1]."""


@dataclass(frozen=True, kw_only=True)
class Attribution:
    quantile: float
    latency_ms: float
    """The quantile of end-to-end trace time."""
    traces: int
    """Traces at or above it."""
    of: int
    """Traces in all."""
    shares: tuple[Share, ...]
    """Largest first."""

    def line(self) -> str:
        """'p99 (12.3 ms, 14 traces): 70% queue wait, 20% model compute, ...'."""
        q = f"p{self.quantile * 100:g}"
        parts = ", ".join(f"{s.share * 100:.0f}% {s.name}" for s in self.shares)
        noun = "trace" if self.traces == 1 else "traces"
        return f"{q} ({self.latency_ms:.3g} ms, {self.traces} {noun}): {parts}"


def attribute(traces: Sequence[Trace], q: float = 0.99) -> Attribution | None:
    """Where the traces at or above the q-quantile of end-to-end time spent it (None: none)."""
    if not traces:
        return None
    cut = nearest_rank([t.duration_ns for t in traces], q)
    tail = [t for t in traces if t.duration_ns >= cut]
    per: dict[str, int] = defaultdict(int)
    for t in tail:
        names = {s.span_id: s.name for s in t.spans}
        for sid, ns in self_times(t).items():
            per[names[sid]] += ns
    total = sum(per.values())
    shares = tuple(Share(name=n, self_ms=v / 1e6, share=v / total if total else 0.0)
                   for n, v in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])))
    return Attribution(quantile=q, latency_ms=cut / 1e6, traces=len(tail), of=len(traces),
                       shares=shares)


@dataclass(frozen=True, kw_only=True)
class Row:
    """One span of a waterfall."""

    depth: int
    name: str
    service: str | None
    offset_ms: float
    """From the trace's start."""
    duration_ms: float
    bar_start: int
    bar_len: int
    """Columns of a `width`-column bar, at least 1."""


def waterfall(trace: Trace, width: int = 40) -> list[Row]:
    """The trace's spans depth first (children in start order) with bar positions."""
    t0, dur = trace.start_ns, trace.duration_ns
    kids = trace.children()
    rows: list[Row] = []

    def visit(s: SpanRec, depth: int) -> None:
        off = s.start_ns - t0
        start = min(width - 1, math.floor(off * width / dur)) if dur else 0
        length = max(1, round(s.duration_ns * width / dur)) if dur else width
        rows.append(Row(depth=depth, name=s.name, service=s.service, offset_ms=off / 1e6,
                        duration_ms=s.duration_ns / 1e6, bar_start=start,
                        bar_len=min(length, width - start)))
        for c in kids.get(s.span_id, ()):
            visit(c, depth + 1)

    for root in kids.get(None, ()):
        visit(root, 0)
    return rows


def slowest(traces: Sequence[Trace], n: int) -> list[Trace]:
    return sorted(traces, key=lambda t: (-t.duration_ns, t.trace_id))[:n]


def summary(spans: Sequence[SpanRec], *, top: int = 5, q: float = 0.99,
            width: int = 40) -> dict[str, Any]:
    """What `scalelab trace show --json` prints (and the report reads)."""
    traces = assemble(spans)
    att = attribute(traces, q)
    return {
        "spans": len(spans), "traces": len(traces),
        "attribution": None if att is None else {
            "quantile": att.quantile, "latency_ms": att.latency_ms, "traces": att.traces,
            "of": att.of, "line": att.line(),
            "shares": [{"name": s.name, "share": s.share, "self_ms": s.self_ms}
                       for s in att.shares]},
        "slowest": [{"trace_id": t.trace_id, "duration_ms": t.duration_ns / 1e6,
                     "spans": [r.__dict__ for r in waterfall(t, width)]}
                    for t in slowest(traces, top)],
    }


TRACES_DIR = "traces"
"""Where a diagnosis keeps span files: OUT/traces/<stage>-<tag>.jsonl."""


def diagnosis_attributions(out_dir: Path, q: float = 0.99) -> dict[str, list[tuple[str, str]]]:
    """stage -> [(tag, attribution line)] for the span files a diagnosis left in
    OUT/traces; a file that cannot be read says so in its line (the report never fails on
    one)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for f in sorted((Path(out_dir) / TRACES_DIR).glob("*.jsonl")):
        stage, _, tag = f.stem.partition("-")
        try:
            att = attribute(assemble(read_spans([f])), q)
            line = "no traces recorded" if att is None else att.line()
        except BadInputError as e:
            line = f"unreadable: {e}"
        out.setdefault(stage, []).append((tag or stage, line))
    return out
