"""What `scalelab compress` reports of a bench run, and what it does with one: each variant's
row, the quality-latency points of the Pareto plot, the on-device timings, the published
versions. The CLI prints these; it computes none of them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from scalelab.lab.core.device import DeviceProfile, choose_mechanism
from scalelab.system.compress.bench import CompressBenchResult, CompressConfig, Variant
from scalelab.system.compress.features import Preprocess, load_split
from scalelab.system.compress.ondevice import measure_on_device
from scalelab.system.compress.pareto import ParetoPoint
from scalelab.system.compress.publish import publish


def variant_row(v: Variant, base: Variant) -> dict[str, Any]:
    """One variant as `compress --json` lists it: quality, its delta, latency per batch size
    and the speed-up over the baseline's, size, memory and cost."""
    m, bm = v.measurement, base.measurement
    assert m is not None and bm is not None and v.quality is not None and v.delta is not None
    lat = {str(t.batch_size): {"p50_ms": t.p50_ms, "p95_ms": t.p95_ms,
                               "rows_per_s": t.rows_per_s} for t in m.timings}
    ratios = {}
    for t in m.timings:
        bt = bm.at(t.batch_size)
        if bt and t.p50_ms > 0:
            ratios[str(t.batch_size)] = bt.p50_ms / t.p50_ms
    return {
        "name": v.name, "technique": v.technique, "parameters": v.parameters,
        "control": not v.requested and v.name != "fp32",
        "quality": {"macro_f1": v.quality.macro_f1, "accuracy": v.quality.accuracy,
                    "weighted_f1": v.quality.weighted_f1,
                    "per_class": {c.name: {"precision": c.precision, "recall": c.recall,
                                           "f1": c.f1, "support": c.support}
                                  for c in v.quality.classes}},
        "delta": v.delta.as_dict(),
        "latency": lat, "speedup_p50": ratios,
        "throughput_rows_per_s": m.throughput_rows_per_s,
        "size_bytes": v.size_bytes,
        "size_ratio": v.extras.get("size_ratio"),
        "peak_memory_bytes": m.peak_memory_bytes,
        "cost_per_1000_usd": m.cost_per_1000_usd,
        "device": m.device,
        "extras": {k: val for k, val in v.extras.items() if k not in ("size_ratio", "device")},
    }


def on_device(result: CompressBenchResult, profile: DeviceProfile, model_path: Path,
              data_dir: Path, cfg: CompressConfig, calls: int) -> dict[str, Any]:
    """Every variant timed at batch 1 in a child held to `profile` (ondevice.py), with the
    limit mechanism the children used."""
    test = load_split(data_dir, "test", Preprocess.read(model_path),
                      max_rows=min(512, cfg.max_test_rows or 512))
    with tempfile.TemporaryDirectory(prefix="scalelab-ondevice-") as d:
        rows = measure_on_device(result.variants, profile, Path(d),
                                 categorical=test.categorical, numeric=test.numeric,
                                 calls=calls)
    # What the children used (a cgroup that could not be made falls back to RLIMIT_AS).
    measured = [r for r in rows if r["measured"]]
    mechanism, note = ((measured[0]["mechanism"], measured[0]["mechanism_note"]) if measured
                       else choose_mechanism(profile))
    return {"profile": profile.as_dict(), "mechanism": mechanism, "mechanism_note": note,
            "batch_size": 1, "calls": calls, "variants": rows}


def publish_variants(result: CompressBenchResult, parent: Path, repo: Path, name: str | None,
                     lineage: Path | None, record_lineage: bool) -> list[dict[str, Any]]:
    """Each requested variant with an architecture as a new version of `name` (default: the
    parent's model) in `repo`, its quality and latency in the version's manifest."""
    name = name or parent.resolve().parent.name
    done = []
    for v in result.variants:
        if not v.requested or v.arch is None:
            continue
        assert v.quality is not None and v.delta is not None and v.measurement is not None
        quality = {"macro_f1": v.quality.macro_f1, "accuracy": v.quality.accuracy,
                   "per_class_f1": {c.name: c.f1 for c in v.quality.classes},
                   "delta": v.delta.as_dict(),
                   "latency_p50_ms": {str(t.batch_size): t.p50_ms for t in v.measurement.timings},
                   "size_bytes": v.size_bytes, "device": v.measurement.device,
                   "experiment": result.experiment}
        p = publish(repo, name, parent_dir=parent, module=v.model, arch=v.arch,
                    params=v.arch_params, technique=v.technique, parameters=v.parameters,
                    quality=quality, lineage=lineage, record_lineage=record_lineage)
        done.append({"variant": v.name, "model": p.name, "version": p.version,
                     "path": str(p.path), "lineage_node": p.lineage_node})
    return done


def pareto_points(result: CompressBenchResult) -> list[ParetoPoint]:
    """Macro F1 against batch-1 p50 latency, per variant measured at batch 1."""
    pts = []
    for v in result.variants:
        t = v.measurement.at(1) if v.measurement else None
        if t is not None and v.quality is not None:
            pts.append(ParetoPoint(name=v.name, latency_ms=t.p50_ms, quality=v.quality.macro_f1))
    return pts
