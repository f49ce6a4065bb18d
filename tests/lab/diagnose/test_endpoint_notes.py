"""A user's endpoint without /metrics: the stage's notes say which signals were not measured."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.lab.diagnose.stages import SECTIONS
from scalelab.lab.diagnose.stages.endpoint import metrics_note


class _NoMetrics(BaseHTTPRequestHandler):
    """200 on /x, 404 elsewhere (so on /metrics); 'not prometheus' on /bad-metrics."""

    def do_GET(self) -> None:
        body = b"ok" if self.path == "/x" else b"{not: prometheus"
        self.send_response(200 if self.path in ("/x", "/bad-metrics") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def base() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NoMetrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_metrics_note_says_404_and_bad_text(base: str) -> None:
    assert metrics_note(f"{base}/metrics") == (
        f"no /metrics at {base}/metrics (404): engine signals not measured")
    bad = metrics_note(f"{base}/bad-metrics")
    assert bad is not None and bad.startswith(f"/metrics at {base}/bad-metrics is not Prometheus")
    assert bad.endswith("engine signals not measured")


def test_a_missing_metrics_is_in_the_stage_notes_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str
) -> None:
    on = {"serve": f"{{url: '{base}/x', levels: [1], base_rate: 5, duration: 1s, capacity: false}}"}
    stages = ", ".join(f"{s.name}: {on.get(s.name, '{enabled: false}')}" for s in SECTIONS)
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(
        f"repeats: 1\nbudget: null\nstages: {{{stages}}}\ncustom:\n"
        f"  - {{name: mine, kind: load, url: '{base}/x', levels: [1], base_rate: 5,"
        " duration: 1s}\n")
    out = tmp_path / "out"
    assert run(["diagnose", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    note = f"no /metrics at {base}/metrics (404): engine signals not measured"
    assert doc["failed_stages"] == {}
    recs = read_records(out / "records.jsonl")
    assert {r.stage for r in recs} == {"serve", "mine"}
    assert all(r.extras["metrics_note"] == note for r in recs)
    stages_doc = {s["stage"]: s for s in doc["verdict"]["stages"]}
    for stage in ("serve", "mine"):
        assert note in stages_doc[stage]["predicted"], stages_doc[stage]
    md = (out / "report.md").read_text()
    assert md.count(note) == 2
