import json
import re
from pathlib import Path

from recordkit import M
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.report.document import write_report


def test_report_is_self_contained_and_consistent(
    tmp_path: Path, serve_records: list[Record]
) -> None:
    sheet = build_sheet(serve_records)
    goals = [
        StageGoal(
            stage="serve",
            objectives=[Objective(metric="p95_ms", max=50)],
            baseline_series="batching=off",
        ),
        StageGoal(stage="data", objectives=[Objective(metric="rate", min=1)]),
    ]
    verdict = judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes)
    files = write_report(tmp_path, sheet, verdict, goals, M, {"mode": "quick"})
    page = files.html.read_text()
    assert page.startswith("<!doctype html>")
    assert "<script" not in page and "<link" not in page and "@import" not in page
    # Nothing is fetched: no src/href attributes pointing anywhere (namespaces are not fetches).
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", page)
    assert "url(http" not in page
    assert page.count("<svg") >= 2  # throughput and latency curves for serving
    assert "serve misses first" in page and "not measured in this run" in page
    doc = json.loads(files.json.read_text())
    assert doc["verdict"]["first"] == "serve"
    serve = doc["verdict"]["stages"][0]
    assert serve["miss"]["multiple"] == 5.0 and serve["limiting"][0]["resource"] == "queue"
    assert len(doc["sheet"]) == 8
    md = files.markdown.read_text()
    assert md.startswith("# scalelab diagnosis") and "| serve | batching=off | 50 |" in md
    # Every check with its outcome, value, n, bounds and rule (1,000 requests a level in the
    # hand-made records; the p95 upper bound is read at p99, the lower at p50).
    assert "| serve | batching=off | 2 | p95_ms ≤ 50 | met | 20 ms | 1,000 | 10 ms–40 ms (95%) | " \
        "order statistic | — |" in md
    assert "| serve | batching=off | 5 | p95_ms ≤ 50 | missed | 400 ms | 1,000 | " \
        "200 ms–800 ms (95%) | order statistic | — |" in md
    assert "- serve: misses p95_ms ≤ 50 at 5× (400 ms on 1,000, 95% bounds 200 ms–800 ms)" in md
    assert "- decided: meets p95_ms ≤ 50 up to 2×, decided at 95%" in md
    check = serve["checks"][2]
    assert {k: check[k] for k in ("multiple", "outcome", "value", "n", "lower", "upper",
                                  "confidence", "rule")} == {
        "multiple": 5.0, "outcome": "missed", "value": 400.0, "n": 1000, "lower": 200.0,
        "upper": 800.0, "confidence": 0.95, "rule": "order statistic"}
    assert serve["outcome"] == "missed" and doc["verdict"]["outcome"] == "missed"
    assert "<td class='l miss'>missed</td>" in page


def test_advice_reads_the_same_in_text_and_html() -> None:
    from scalelab.lab.core.decide import Decision
    from scalelab.lab.core.objectives import Check
    from scalelab.lab.core.verdict import Advice, Headroom, StageVerdict, Verdict
    from scalelab.lab.report.document import _stage_findings_html
    from scalelab.lab.report.verdict_text import verdict_lines

    met = Check(stage="serve", series="", level=100.0, multiple=10.0,
                objective=Objective(metric="p95_ms", max=50, label="p95 ≤ 50 ms"),
                decision=Decision(outcome="met", value=40.0, n=1, basis="point"))
    s = StageVerdict(stage="serve", measured=True, passed_up_to=10.0, target_multiple=10.0,
                     checks=(met,), advice=Advice(intervention="add <2> workers"),
                     tightest=Headroom(check=met, margin=0.2))
    assert verdict_lines(Verdict(stages=(s,)))[1:] == [
        "serve: meets p95 ≤ 50 ms up to 10×, as measured points", "  do: add <2> workers",
        "  least headroom: p95 ≤ 50 ms: 40 ms at 10× (20% headroom)"]
    page = _stage_findings_html(s, None, [], [])
    assert page[1:4] == ["<li>do: add &lt;2&gt; workers</li>",
                         "<li>least headroom: p95 ≤ 50 ms: 40 ms at 10× (20% headroom)</li>",
                         "</ul>"]
