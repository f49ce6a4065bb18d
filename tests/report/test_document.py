import json
import re
from pathlib import Path

from recordkit import M
from scalelab.core.objectives import Objective
from scalelab.core.records import Record
from scalelab.core.sheet import build_sheet
from scalelab.core.verdict import StageGoal, judge
from scalelab.report.document import write_report


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
