"""`online.bench`: policies side by side on one replay, one record per policy in the core
schema, and the drift-vs-best-fixed comparison."""

from __future__ import annotations

from pathlib import Path

from scalelab.lab.core.records import Record
from scalelab.system.online.bench import OnlineBenchConfig, compare_policies, run_bench
from scalelab.system.online.stream import ReplayConfig
from scalelab.system.online.updater import UpdaterConfig


def test_policies_side_by_side_with_records(tmp_path: Path, week_schema: Path) -> None:
    cfg = OnlineBenchConfig(policies=["never", "weekly", "every-2", "drift"],
                            stream=ReplayConfig(end="2013-01-22T00"),
                            updater=UpdaterConfig(bootstrap_hours=7 * 24), schema=week_schema)
    res = run_bench(cfg, tmp_path, "test-online")
    rows = {p["result"]["policy"]: p["result"] for p in res["policies"]}
    assert rows["never"]["update_samples"] == 0 and rows["never"]["updates_per_30d"] == 0
    assert rows["every-2"]["promoted"] + rows["every-2"]["refused"] == 7  # 14 windows
    assert rows["weekly"]["promoted"] + rows["weekly"]["refused"] == 2
    assert rows["every-2"]["update_samples"] > rows["weekly"]["update_samples"] > 0
    recs: list[Record] = res["records"]
    assert [r.series for r in recs] == ["never", "fixed", "fixed", "drift"]
    assert all(r.stage == "online" and r.variable == "updates_per_30d" for r in recs)
    assert recs[2].level == 7 * 30 / 14  # 7 attempts in 14 replayed daily windows
    # Each policy's own peak resident memory (core.peak_memory), not the process's running max.
    assert all(r.peak_memory_bytes and r.peak_memory_bytes > 0 for r in recs)
    assert res["ingest"]["events"]["received"] == res["stream"]["rows"]
    cmp_ = compare_policies([p["result"] for p in res["policies"]])
    best = max((rows["weekly"], rows["every-2"]), key=lambda r: r["macro_f1"])
    assert cmp_["best_fixed"] == best["policy"]
    assert cmp_["compute_ratio"] == rows["drift"]["update_samples"] / best["update_samples"]
