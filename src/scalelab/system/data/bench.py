"""`scalelab data bench`: the pipeline at several scales, one record (stage "data") per level.

For each scale k the flights are generated (outside the timed region; cached under WORK/x{k} as
long as the manifest's parameters match) with the bench defects, then `data run` is timed.
Each record carries rows/s, peak memory (RSS of the process tree, sampled), wall time, the
quarantine rate as the failure rate, the cost at `price_per_core_hour` x the CPU-seconds the run
used, and in extras the measured CPU time and busy cores (this process and the Dask workers it
waited for), the machine's I/O wait share, the stage times, the dominant stage, partition skew
and spill (Dask).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.machine import available_cores
from scalelab.lab.core.prices import DEFAULT as DEFAULT_PRICES
from scalelab.lab.core.records import Cost, Record, append_records, make_record, new_experiment_id
from scalelab.lab.core.usage import UsageMeter
from scalelab.system.data.generate import (
    GenerateConfig,
    Written,
    base_flights,
    generate_one,
    parse_defects,
)
from scalelab.system.data.pipeline import PipelineConfig, run_pipeline

DEFAULT_DEFECTS = ("duplicates=0.01,out_of_range=0.005,nulls=0.005,unparsable=0.002,"
                   "label_conflicts=0.001")
DEFAULT_PRICE_PER_CORE_HOUR = DEFAULT_PRICES.core_hour_usd
"""USD per core-hour: roughly an on-demand general-purpose cloud vCPU in 2024-2026
(e.g. 2 vCPU / 8 GiB at ~$0.096/h); pass --price-per-core-hour for yours."""


@dataclass(frozen=True, kw_only=True)
class DataBenchConfig:
    """What `scalelab data bench` measures."""

    scales: tuple[int, ...] = (1, 2, 5, 10)
    """Copies of the 2013 flights per level."""
    engine: str = "local"
    """Pipeline engine: local or dask."""
    workers: int | None = None
    """Dask LocalCluster workers (default: available cores)."""
    address: str | None = None
    """Dask scheduler address (engine dask)."""
    work: Path | None = None
    """Where generated inputs and outputs go (default: a temporary directory, removed)."""
    defects: str = DEFAULT_DEFECTS
    """Defects injected into the generated inputs."""
    sample: int | None = None
    """Use about SAMPLE flights per copy instead of all 336,776 (quick runs)."""
    seed: int = 0
    price_per_core_hour: float = DEFAULT_PRICE_PER_CORE_HOUR
    """USD per core-hour for the cost column."""
    repeats: int = 1
    """Timed runs per level."""
    experiment: str = field(default_factory=lambda: new_experiment_id("data-bench"))

    def __post_init__(self) -> None:
        if not self.scales or any(k < 1 for k in self.scales):
            raise BadUsageError("--scale: give positive copies like 1,2,5,10")
        if self.price_per_core_hour < 0:
            raise BadUsageError("--price-per-core-hour must be >= 0")
        if self.repeats < 1:
            raise BadUsageError("--repeats must be >= 1")
        parse_defects(self.defects)


@dataclass(kw_only=True)
class _Inputs:
    """What the bench's levels share while generating: the sampled flights, read once, and
    the files written so far (data.generate.Written)."""

    base: pl.DataFrame | None = None
    written: Written = field(default_factory=Written)


def prepare_inputs(cfg: DataBenchConfig, work: Path, k: int,
                   shared: _Inputs | None = None) -> Path:
    """Generate WORK/gen/x{k} unless a matching one (seed, sample, defects) is already there;
    `shared` carries the base flights and the files of the scales generated before this one."""
    gen = GenerateConfig(scales=(k,), out=work / "gen", seed=cfg.seed,
                         defects=parse_defects(cfg.defects), sample=cfg.sample)
    root = work / "gen" / f"x{k}"
    mp = root / "manifest.json"
    if mp.is_file():
        params = json.loads(mp.read_text(encoding="utf-8")).get("parameters", {})
        want = json.loads(json.dumps(asdict(gen.defects)))
        if (params.get("seed"), params.get("sample"), params.get("defects")) == (
                cfg.seed, cfg.sample, want):
            return root
    gen.out.mkdir(parents=True, exist_ok=True)
    shared = shared if shared is not None else _Inputs()
    if shared.base is None:
        shared.base = base_flights(cfg.sample)
    generate_one(gen, k, shared.base, shared.written)
    return root


def run_bench(cfg: DataBenchConfig, records: Path | None = None) -> list[Record]:
    """Measure every level; append the records to RECORDS if given; return them."""
    tmp = None
    if cfg.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="scalelab-data-bench-")
        work = Path(tmp.name)
    else:
        work = cfg.work
    cores = cfg.workers if cfg.engine == "dask" and cfg.workers else available_cores()
    out: list[Record] = []
    shared = _Inputs()
    try:
        for k in cfg.scales:
            root = prepare_inputs(cfg, work, k, shared)
            for rep in range(cfg.repeats):
                with UsageMeter() as meter:
                    r = run_pipeline(PipelineConfig(input=root, out=work / "out" / f"x{k}",
                                                    engine=cfg.engine, workers=cfg.workers,
                                                    address=cfg.address, register=False))
                # Cost from the CPU time the run really used (this process and the Dask
                # workers it waited for), not from wall time x cores it may have left idle.
                usage = meter.usage
                usd = usage.cpu_s / 3600 * cfg.price_per_core_hour
                skew = r.partitions.get("skew", {}) if r.partitions else {}
                rec = make_record(
                    experiment=cfg.experiment, stage="data", variable="scale", level=k,
                    repeat=rep, input_volume=r.rows_in, input_unit="rows",
                    rate=r.rows_in / r.wall_s if r.wall_s else None, rate_unit="rows/s",
                    wall_s=r.wall_s, peak_memory_bytes=r.peak_memory_bytes,
                    failures=r.quarantined_rows, failure_rate=r.quarantine_rate,
                    quality={"rows_out": float(r.rows_out),
                             "deduplicated": float(r.exact_duplicates + r.key_duplicates)},
                    cost=Cost(usd=usd, per_unit_usd=usd / r.rows_in * 1e6 if r.rows_in else None,
                              unit="1M rows"),
                    recovery="quarantine + atomic publish (rerun is idempotent)",
                    ok=r.reconciliation["holds"],
                    resources=usage.resources(
                        spilled_bytes=(r.partitions or {}).get("spilled_disk_bytes")),
                    extras={"engine": cfg.engine, "workers": cfg.workers,
                            "stage_seconds": {s.name: s.seconds for s in r.stages},
                            "stage_peak_memory_bytes": {s.name: s.peak_memory_bytes
                                                        for s in r.stages},
                            "dominant_stage": r.dominant_stage, "partition_skew": skew,
                            "price_per_core_hour": cfg.price_per_core_hour, "cores": cores,
                            # core.sheet.SAMPLES_KEY: the rows the quarantine rate rests on
                            "samples": r.rows_in, "samples_unit": "rows",
                            **usage.extras(),
                            "digest": r.digest, "reconciliation": r.reconciliation})
                out.append(rec)
                if records is not None:
                    append_records(records, [rec])
    finally:
        if tmp is not None:
            tmp.cleanup()
    return out
