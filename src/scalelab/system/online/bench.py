"""The online benchmark: one replay ingested once, then prequential evaluation per update
policy, side by side, with the sheet's fields as records.

Per policy: prequential macro F1 and accuracy on late labels, update attempts (promoted, refused,
rolled back), compute (rows x epochs trained by updates, CPU seconds, cost at a core-hour price),
staleness, update time, rollback time. The variable is the update frequency: attempts per 30 days
(never 0, monthly 1, weekly 4.3, daily 30; drift what it did).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.peak_memory import PeakMemory
from scalelab.lab.core.prices import DEFAULT as DEFAULT_PRICES
from scalelab.lab.core.records import Cost, Latency, Record, make_record
from scalelab.system.online.ingest import ingest_source, load_rules
from scalelab.system.online.log import EventLog
from scalelab.system.online.policy import make_policy
from scalelab.system.online.prequential import PrequentialResult, run
from scalelab.system.online.schema import write_schema
from scalelab.system.online.stream import ReplayConfig, build_stream
from scalelab.system.online.updater import StreamData, UpdaterConfig

STAGE = "online"
VARIABLE = "updates_per_30d"


@dataclass(kw_only=True)
class OnlineBenchConfig:
    policies: list[str] = field(default_factory=lambda: ["never", "monthly", "weekly", "daily",
                                                         "drift"])
    stream: ReplayConfig = field(default_factory=ReplayConfig)
    updater: UpdaterConfig = field(default_factory=UpdaterConfig)
    drift_threshold: float = 50.0
    drift_delta: float = 0.005
    drift_min_gap: int = 1
    drift_backoff: float = 2.0
    """The drift policy's back-off factor after refused attempts (1: none; `policy.Drift`)."""
    batch_size: int = 4096
    price_per_core_hour: float = DEFAULT_PRICES.core_hour_usd
    schema: Path | None = None
    """A schema file; None infers one from the clean replay (scalelab data infer)."""

    def __post_init__(self) -> None:
        if not self.policies:
            raise BadInputError("give at least one policy")
        for p in self.policies:
            make_policy(p, backoff=self.drift_backoff, max_wait=self.updater.lookback_windows())


def series_of(policy: str) -> str:
    """never, fixed (the periodic policies: one curve over frequency), or the drift policy."""
    return policy if policy == "never" or policy.startswith("drift") else "fixed"


def per_30d(r: PrequentialResult, tick_hours: float) -> float:
    """Update attempts per 30 days of replayed windows after the bootstrap."""
    windows = 1 + max((d.window for d in r.decisions), default=0)
    days = windows * tick_hours / 24
    return (r.promoted + r.refused) * 30.0 / days if days > 0 else 0.0


def run_bench(cfg: OnlineBenchConfig, work: Path, experiment: str,
              on_window: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Ingest once, then replay every policy; `on_window(policy, done, total)` after each
    window of each replay."""
    work.mkdir(parents=True, exist_ok=True)
    schema = cfg.schema or write_schema(work / "schema.json",
                                        ReplayConfig(start=cfg.stream.start, end=cfg.stream.end))
    rules = load_rules(schema)
    stream = build_stream(cfg.stream)
    log_path = work / "log.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{log_path}{suffix}").unlink(missing_ok=True)
    ingest: dict[str, Any] = {}
    with EventLog(log_path) as log:
        for name, source in (("events", stream.feature_events()),
                             ("labels", stream.label_events())):
            t0, c0 = time.perf_counter(), time.process_time()
            sums = ingest_source(log, rules, name, source, batch_size=cfg.batch_size)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            ingest[name] = {**sums, "wall_s": wall, "cpu_s": cpu,
                            "events_per_s": sums["received"] / wall if wall else None,
                            "events_per_cpu_s": sums["received"] / cpu if cpu else None}
        data = StreamData.from_frames(log.read("events"), log.labels(), log.quarantine())
    span_days = (int(data.t_event.max()) - int(data.t_event.min())) / 86_400e6
    results: list[dict[str, Any]] = []
    records: list[Record] = []
    for name in cfg.policies:
        policy = make_policy(name, threshold=cfg.drift_threshold, delta=cfg.drift_delta,
                             min_gap=cfg.drift_min_gap, backoff=cfg.drift_backoff,
                             max_wait=cfg.updater.lookback_windows())
        # Each policy's own peak: ru_maxrss only grows, so a later policy read an earlier's.
        with PeakMemory() as peak:
            r = run(data, rules, policy, cfg.updater,
                    on_window=None if on_window is None else functools.partial(on_window, name))
        boot = r.decisions[0].cost.get("samples", 0)
        upd_samples = r.samples_trained - boot
        cpu = r.train_cpu_s + r.predict_cpu_s
        usd = cpu / 3600 * cfg.price_per_core_hour
        level = per_30d(r, cfg.updater.tick_hours)
        row = {**r.summary(), "series": series_of(name), "updates_per_30d": level,
               "update_samples": upd_samples, "cpu_s": cpu, "cost_usd": usd,
               # per prediction served: shadow scoring and gate evaluations are costs, not output
               "cost_per_1000_predictions_usd": usd / r.served * 1000 if r.served else None,
               "cost_per_update_usd": (r.train_cpu_s / 3600 * cfg.price_per_core_hour
                                       / (r.promoted + r.refused))
               if r.promoted + r.refused else None}
        results.append({"result": row, "decisions": [d.to_dict() for d in r.decisions]})
        ev = ingest["events"]
        up_ms = sorted(s * 1000 for s in r.update_s)
        records.append(make_record(
            experiment=experiment, stage=STAGE, variable=VARIABLE, level=level,
            input_volume=float(ev["received"]), input_unit="events",
            rate=ev["events_per_s"], rate_unit="events/s ingested", wall_s=r.wall_s,
            latency=Latency(p50_ms=statistics.median(up_ms), p95_ms=up_ms[int(
                0.95 * (len(up_ms) - 1))], max_ms=up_ms[-1]) if up_ms else None,
            peak_memory_bytes=peak.peak_bytes or None,
            failures=ev["quarantined"] + r.refused,
            failure_rate=ev["quarantined"] / ev["received"] if ev["received"] else None,
            quality={"macro_f1": r.macro_f1, "accuracy": r.accuracy},
            cost=Cost(usd=usd, per_unit_usd=row["cost_per_1000_predictions_usd"],
                      unit="1000 predictions"),
            recovery="rollback to the previous version on late labels",
            limiting_resource="cpu (fine-tunes)" if r.promoted + r.refused else None,
            series=series_of(name),
            extras={"policy": name, "promoted": r.promoted,
                    # core.sheet: the events the quarantine rate rests on, the updates the
                    # update-latency quantiles rest on
                    "samples": ev["received"], "samples_unit": "events",
                    "latency_samples": len(up_ms),
                    "refused": r.refused, "rolled_back": r.rolled_back,
                    "quarantined_windows": r.quarantined_windows,
                    "update_samples": upd_samples, "train_cpu_s": r.train_cpu_s,
                    "staleness_h": r.staleness_h,
                    "rollback_ms": max(r.rollback_s) * 1000 if r.rollback_s else None,
                    "cost_per_update_usd": row["cost_per_update_usd"],
                    "feature_version": r.feature_version,
                    # quality over time: the report draws it (as --plot does)
                    "monthly": r.monthly}))
    return {"stream": stream.manifest(), "schema": str(schema), "ingest": ingest,
            "span_days": span_days, "policies": results, "records": records}


def compare_policies(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The drift target, read off the results: best fixed period by macro F1, and the drift
    policy's F1 gap (points) and compute ratio (update samples) against it."""
    fixed = [r for r in rows if r["series"] == "fixed"]
    drift = [r for r in rows if r["series"].startswith("drift")]
    if not fixed or not drift:
        return {}
    best = max(fixed, key=lambda r: r["macro_f1"])
    out: dict[str, Any] = {"best_fixed": best["policy"],
                           "best_fixed_macro_f1": best["macro_f1"], "drift": []}
    for d in drift:
        gap = (best["macro_f1"] - d["macro_f1"]) * 100
        ratio = d["update_samples"] / best["update_samples"] if best["update_samples"] \
            else None
        out["drift"].append({"policy": d["policy"], "macro_f1": d["macro_f1"],
                             "gap_points": gap, "compute_ratio": ratio,
                             "target_met": gap <= 1.0 and ratio is not None
                             and ratio <= 1 / 3})
    out.update({k: v for k, v in out["drift"][0].items() if k != "policy"})
    return out
