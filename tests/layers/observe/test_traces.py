"""observe.traces: assembly, self time, p99 attribution and waterfalls on hand-made spans
(exact numbers), and `scalelab trace show` on a file (JSON, text, bad lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scalelab.cli import run
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.observe.traces import (
    SpanRec,
    assemble,
    attribute,
    covered_ns,
    nearest_rank,
    read_spans,
    self_times,
    summary,
    waterfall,
)

MS = 1_000_000
A, B = "a" * 32, "b" * 32


def span(trace: str, sid: str, parent: str | None, name: str, start_ms: float,
         end_ms: float) -> SpanRec:
    return SpanRec(trace_id=trace, span_id=sid.ljust(16, "0"),
                   parent_id=None if parent is None else parent.ljust(16, "0"), name=name,
                   start_ns=round(start_ms * MS), end_ns=round(end_ms * MS),
                   service="scalelab-serve")


def spans() -> list[SpanRec]:
    """Trace A: 10 ms, 6 of them queued; trace B: 2 ms. Trace A's root has a parent that is
    not in the file (a client started it)."""
    return [
        span(A, "a1", "c1", "infer", 0, 10),
        span(A, "a2", "a1", "admission", 0, 1),
        span(A, "a3", "a1", "queue wait", 1, 7),
        span(A, "a4", "a1", "model compute", 7, 9),
        span(A, "a5", "a1", "post-processing", 9, 9.5),
        span(B, "b1", None, "infer", 100, 102),
        span(B, "b2", "b1", "admission", 100, 100.5),
        span(B, "b3", "b1", "queue wait", 100.5, 101),
        span(B, "b4", "b1", "model compute", 101, 102),
    ]


def as_line(s: SpanRec) -> str:
    return json.dumps({"trace_id": s.trace_id, "span_id": s.span_id, "parent_id": s.parent_id,
                       "name": s.name, "kind": "internal", "start_ns": s.start_ns,
                       "end_ns": s.end_ns, "attributes": {}, "status": "unset",
                       "service": s.service})


def test_covered_is_the_union_clipped() -> None:
    assert covered_ns([(0, 5), (3, 8), (10, 12)], 1, 11) == 8
    assert covered_ns([], 0, 10) == 0
    assert covered_ns([(20, 30)], 0, 10) == 0


def test_assemble_and_self_times() -> None:
    a, b = assemble(spans())
    assert (a.trace_id, b.trace_id) == (A, B)
    assert (a.duration_ns, b.duration_ns) == (10 * MS, 2 * MS)
    assert [s.name for s in a.children()[None]] == ["infer"]  # parent c1 is not in the trace
    st = self_times(a)
    assert st["a1".ljust(16, "0")] == MS // 2  # 10 ms less 9.5 ms of children
    assert st["a3".ljust(16, "0")] == 6 * MS
    assert sum(st.values()) == a.duration_ns  # well nested: self times add up to the root


def test_a_span_in_two_files_counts_once() -> None:
    (t,) = assemble(spans()[:5] + spans()[:2])
    assert len(t.spans) == 5


def test_nearest_rank() -> None:
    assert nearest_rank([3, 1, 2, 4], 0.5) == 2
    assert nearest_rank([3, 1, 2, 4], 0.99) == 4
    assert nearest_rank([7], 0.99) == 7


def test_p99_attribution_over_the_tail() -> None:
    att = attribute(assemble(spans()), 0.99)
    assert att is not None
    assert (att.latency_ms, att.traces, att.of) == (10.0, 1, 2)
    assert [(s.name, s.self_ms) for s in att.shares] == [
        ("queue wait", 6.0), ("model compute", 2.0), ("admission", 1.0), ("infer", 0.5),
        ("post-processing", 0.5)]
    assert att.line() == ("p99 (10 ms, 1 trace): 60% queue wait, 20% model compute, "
                          "10% admission, 5% infer, 5% post-processing")
    # the median takes both traces: 12 ms of self time, 6.5 of it queued
    med = attribute(assemble(spans()), 0.5)
    assert med is not None and med.traces == 2
    assert med.shares[0].name == "queue wait" and med.shares[0].share == pytest.approx(6.5 / 12)
    assert attribute([], 0.99) is None


def test_waterfall_rows() -> None:
    rows = waterfall(assemble(spans())[0], width=20)
    assert [(r.depth, r.name, r.bar_start, r.bar_len) for r in rows] == [
        (0, "infer", 0, 20), (1, "admission", 0, 2), (1, "queue wait", 2, 12),
        (1, "model compute", 14, 4), (1, "post-processing", 18, 1)]
    assert rows[3].offset_ms == 7.0 and rows[3].duration_ms == 2.0


def test_summary_orders_the_slowest_first() -> None:
    doc = summary(spans(), top=1)
    assert (doc["spans"], doc["traces"]) == (9, 2)
    assert [t["trace_id"] for t in doc["slowest"]] == [A]
    assert doc["attribution"]["line"].startswith("p99 (10 ms, 1 trace): 60% queue wait")


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_round_trip_and_blank_lines(tmp_path: Path) -> None:
    f = write(tmp_path / "s.jsonl", [as_line(s) for s in spans()[:3]] + [""])
    assert read_spans([f]) == spans()[:3]


@pytest.mark.parametrize(("bad", "says"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "not an object"),
    (json.dumps({"trace_id": "xyz", "span_id": "0" * 16, "name": "n", "start_ns": 1,
                 "end_ns": 2}), "trace_id 'xyz' is not 32 lowercase hex digits"),
    (json.dumps({"trace_id": A, "span_id": "1" * 16, "name": "n", "start_ns": 5,
                 "end_ns": 2}), "end_ns 2 is before start_ns 5"),
    (json.dumps({"trace_id": A, "span_id": "1" * 16, "start_ns": 1, "end_ns": 2}),
     "field 'name' is missing"),
])
def test_a_bad_line_is_named(tmp_path: Path, bad: str, says: str) -> None:
    f = write(tmp_path / "s.jsonl", [as_line(spans()[0]), bad])
    with pytest.raises(BadInputError, match=rf"s\.jsonl:2: .*{says}"):
        read_spans([f])


def test_trace_show_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path / "s.jsonl", [as_line(s) for s in spans()])
    assert run(["trace", "show", str(f), "--top", "2", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert doc["attribution"]["latency_ms"] == 10.0
    assert [t["duration_ms"] for t in doc["slowest"]] == [10.0, 2.0]
    assert run(["trace", "show", str(f), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "p99 (10 ms, 1 trace): 60% queue wait" in out and f"trace {A}" in out
    assert f"trace {B}" not in out


def test_trace_show_bad_line_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path / "s.jsonl", [as_line(spans()[0]), "oops"])
    assert run(["trace", "show", str(f)]) == 2
    err = capsys.readouterr().err
    assert "s.jsonl:2: not JSON" in " ".join(err.split()) and "Traceback" not in err
    assert run(["trace", "show", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such span file" in capsys.readouterr().err


def test_the_report_shows_each_stage_p99_line(tmp_path: Path, serve_records: list[Any]) -> None:
    from recordkit import M
    from scalelab.lab.core.objectives import Objective
    from scalelab.lab.core.sheet import build_sheet
    from scalelab.lab.core.verdict import StageGoal, judge
    from scalelab.lab.report.document import write_report

    (tmp_path / "traces").mkdir()
    write(tmp_path / "traces" / "serve-batching-on.jsonl", [as_line(s) for s in spans()])
    write(tmp_path / "traces" / "serve-batching-off.jsonl", ["oops"])
    sheet = build_sheet(serve_records)
    goals = [StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)],
                       baseline_series="batching=off")]
    verdict = judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes)
    files = write_report(tmp_path, sheet, verdict, goals, M, {"mode": "quick"})
    line = "p99 (10 ms, 1 trace): 60% queue wait, 20% model compute"
    assert f"traces (batching-on, highest level): {line}" in files.html.read_text()
    md = files.markdown.read_text()
    assert f"- serve (batching-on): {line}" in md
    assert "- serve (batching-off): unreadable: " in md and "serve-batching-off.jsonl:1" in md
    doc = json.loads(files.json.read_text())
    assert [t["tag"] for t in doc["traces"]["serve"]] == ["batching-off", "batching-on"]
