"""`scalelab compress --device SPEC`: every variant timed in a child held to the device, on the
small trained flights model (one run, several checks)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from scalelab.cli import run
from scalelab.system.compress.ondevice import time_version, write_rows

from .conftest import Flights

CPU0 = sorted(os.sched_getaffinity(0))[:1]


@pytest.fixture(scope="module")
def on_device(flights: Flights) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = run(["compress", "--model", str(flights.version), "--data", str(flights.data),
                  "--variants", "int8,cache", "--device", "cores=1,memory=3GiB",
                  "--max-train-rows", "2000", "--max-test-rows", "500", "--calls", "20",
                  "--rounds", "1", "--cache-requests", "100", "--no-lineage", "--json"])
    assert rc == 0, buf.getvalue()
    doc = json.loads(buf.getvalue())
    return doc["on_device"]  # type: ignore[no-any-return]


def test_every_model_variant_fits_and_reports_latency_and_rss(on_device: dict[str, Any]) -> None:
    assert on_device["profile"]["label"] == "cores=1,memory=3GiB,threads=1"
    assert on_device["mechanism"] in ("cgroup2", "rlimit_as")
    rows = {r["variant"]: r for r in on_device["variants"]}
    assert list(rows) == ["fp32", "int8", "cache"]
    for name in ("fp32", "int8"):
        r = rows[name]
        assert r["fit"] is True and r["measured"] is True, r
        assert 0 < r["p50_ms"] <= r["p95_ms"]
        assert r["peak_rss_bytes"] > 1 << 20
        assert r["cpus"] == CPU0
        assert r["threads"] == 1
        assert r["mechanism"] == on_device["mechanism"]


def test_a_cache_is_listed_as_not_measured(on_device: dict[str, Any]) -> None:
    r = next(r for r in on_device["variants"] if r["variant"] == "cache")
    assert r == {"variant": "cache", "fit": None, "measured": False,
                 "reason": "not a standalone model (nothing to load)"}


def test_model_time_in_process(flights: Flights, tmp_path: Path) -> None:
    from scalelab.system.compress.features import Preprocess, load_split

    test = load_split(flights.data, "test", Preprocess.read(flights.version), max_rows=64)
    rows = write_rows(tmp_path / "rows.safetensors", test.categorical, test.numeric)
    out = time_version(flights.version, rows, calls=5, warmup=1)
    assert out["calls"] == 5 and 0 < out["p50_ms"] <= out["p95_ms"]


def test_bad_device_spec_is_exit_2_before_any_work(flights: Flights) -> None:
    assert run(["compress", "--model", str(flights.version), "--data", str(flights.data),
                "--device", "cores=1,memory=512MB,gpu=1"]) == 2
