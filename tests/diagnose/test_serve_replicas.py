"""The serve stage's replica sweep end to end: real server processes (1 and 2 uvicorn workers
behind one port), real capacity searches, the advice quoting them. Slow (two servers that import
torch, plus the data and training steps the served model needs): `make test-slow`; the pure
pieces are in test_serve_curve.py."""

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.core.records import read_records

OFF = "{enabled: false}"


@pytest.mark.slow
def test_replica_sweep_measures_each_count(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from scalelab.diagnose.stages import SECTIONS

    on = {
        "data": "{levels: [1], sample_rows: 2000}",
        "train": "{workers: [1], steps: 5, limit_rows: 5000, objectives: []}",
        "serve": "{base_rate: 40, levels: [1], duration: 1s, batching: ['on'], "
                 "capacity_max_steps: 2, capacity_step: 1s, replicas: [1, 2], threads: false, "
                 "objectives: [{metric: p95_ms, max: 50}]}",
    }
    body = ", ".join(f"{s.name}: {on.get(s.name, OFF)}" for s in SECTIONS)
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("repeats: 1\nstages: {" + body + "}\n")
    out = tmp_path / "out"
    assert run(["diagnose", "--quick", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed_steps"] == []
    recs = [r for r in read_records(out / "records.jsonl") if r.stage == "serve"]
    swept = {r.extras["series"]: r for r in recs if "server_processes" in r.extras}
    assert set(swept) == {"replicas=1 capacity", "replicas=2 capacity"}
    assert swept["replicas=2 capacity"].extras["server_processes"] == 2
    assert all(r.extras["torch_threads"] == 1 and r.extras["ready_s"] > 0
               and r.extras["replicated"] == "batching=on" for r in swept.values())
    # Sized by the rule: the first step (40 req/s) could reach the 230 requests p95 needs.
    first = min((r for r in recs if r.extras["series"] == "replicas=1 capacity"),
                key=lambda r: r.level)
    assert first.extras["requests_needed"] == 230 and (first.input_volume or 0) >= 230
    assert all(r.extras["rate_verdict"] in ("pass", "fail", "undecided-pass", "undecided-fail")
               for r in swept.values())
    serve = next(s for s in doc["verdict"]["stages"] if s["stage"] == "serve")
    assert "replicas of batching=on measured at the objective (1 torch thread each): 1 → " \
        in serve["predicted"]
