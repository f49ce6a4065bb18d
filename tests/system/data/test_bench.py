"""`scalelab data bench`: one valid record (stage "data") per level, appended to --records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records


def test_bench_writes_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs_path = tmp_path / "records.jsonl"
    args = ["data", "bench", "--scale", "1,2", "--sample", "2000", "--work", str(tmp_path / "w"),
            "--records", str(recs_path), "--price-per-core-hour", "1.0", "--json"]
    assert run(args) == 0
    out = json.loads(capsys.readouterr().out)
    recs = read_records(recs_path)
    assert [r.level for r in recs] == [1.0, 2.0] and len(out) == 2
    for r in recs:
        assert r.stage == "data" and r.variable == "scale" and r.rate_unit == "rows/s"
        assert r.rate and r.rate > 0 and r.peak_memory_bytes and r.ok
        assert r.failures > 0 and 0 < (r.failure_rate or 0) < 0.1
        # The verdict's n: the rows the quarantine rate rests on.
        assert r.extras["samples"] == r.input_volume and r.extras["samples_unit"] == "rows"
        assert r.cost and r.cost.usd > 0 and r.cost.unit == "1M rows"
        assert set(r.extras["stage_seconds"]) >= {"ingest", "validate", "dedupe", "write"}
        assert r.extras["reconciliation"]["holds"]
    assert recs[1].input_volume > recs[0].input_volume
    # Inputs are reused when the parameters match (same digest, no regeneration).
    assert run([*args[:-1]]) == 0
    again = read_records(recs_path)
    assert len(again) == 4 and again[2].extras["digest"] == recs[0].extras["digest"]
    assert run(["data", "bench", "--scale", "1", "--price-per-core-hour", "-1"]) == 2
