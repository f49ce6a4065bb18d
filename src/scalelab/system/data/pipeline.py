"""`scalelab data run`: ingest -> validate -> quarantine -> dedupe -> join -> features -> split.

Writes OUT/ with train.parquet, test.parquet, quarantine.parquet, stats.json and manifest.json,
built in a sibling staging directory and renamed into place only after the reconciliation
(rows_in = rows_out + quarantined + deduplicated) and the leakage check pass, so a failed run
never leaves (or registers in lineage) a half-written dataset.

The two engines share every per-partition function (ingest.py, quarantine.py, dedupe.py,
features.py, split.py) and the writer here, and sort before writing, so the same input gives
byte-identical tables, statistics and digests on either engine and any worker count.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.lineage.manifest import (
    ContentDigest,
    Manifest,
    atomic_write_json,
    directory_digest,
    file_digest,
    file_entry,
    fsync_dir,
    table_row_group_digest,
)
from scalelab.system.data.engine import EngineOutput, PipelineConfig
from scalelab.system.data.features import FEATURE_COLUMNS, Dimensions
from scalelab.system.data.flights import read_dimension
from scalelab.system.data.ingest import list_inputs
from scalelab.system.data.meter import MemorySampler, StageMeter, StageReport
from scalelab.system.data.quarantine import sort_quarantine
from scalelab.system.data.split import check_leakage


@dataclass(kw_only=True)
class PipelineResult:
    """What a run did: counts, reconciliation, stages, digests."""

    out: Path
    engine: str
    rows_in: int
    train_rows: int
    test_rows: int
    quarantined_rows: int
    quarantine_records: int
    exact_duplicates: int
    key_duplicates: int
    reconciliation: dict[str, Any]
    quarantine_by_rule: dict[str, int]
    anomalies: list[dict[str, Any]]
    stages: list[StageReport]
    dominant_stage: str | None
    wall_s: float
    peak_memory_bytes: int
    digest: str
    file_digests: dict[str, str]
    cutoff_month: int
    leakage: dict[str, int]
    partitions: dict[str, Any] = field(default_factory=dict)
    """Dask only: per-partition rows and seconds, skew (max/median), spill."""
    input_files: int = 0

    @property
    def rows_out(self) -> int:
        return self.train_rows + self.test_rows

    @property
    def quarantine_rate(self) -> float:
        return self.quarantined_rows / self.rows_in if self.rows_in else 0.0


def load_dimensions(root: Path) -> Dimensions:
    """Dimension tables from the dataset directory if present, else the package's."""
    src = root if (root / "weather.csv").is_file() else None
    return Dimensions.from_raw(read_dimension("weather", src), read_dimension("planes", src),
                               read_dimension("airlines", src))


def _write_table(df: pl.DataFrame, path: Path, row_group_size: int) -> ContentDigest:
    """Write DF as Parquet; return its per-row-group digest, computed from memory (the bytes
    just written are not read back: that cost ~40% of the write stage).

    Polars' writer encodes row groups on all cores: 0.74 s for scale 10's train table where
    pyarrow's (one thread) took 1.63 s. It cuts row groups at exact multiples of
    ROW_GROUP_SIZE, as table_row_group_digest assumes (tests check the two digests agree)."""
    # The digest (and the Arrow copy it reads: 0.2-0.3 s for train at scale 10) runs beside
    # the writer; both release the GIL: ~40% off this stage on 2 cores.
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(lambda: table_row_group_digest(df.to_arrow(), row_group_size))
        # snappy: ~2x faster to write than zstd here, files ~30% larger.
        df.write_parquet(path, row_group_size=row_group_size, compression="snappy")
        return digest.result()


def _input_entries(files: list[Path]) -> list[dict[str, Any]]:
    """The manifest's inputs: each flights file's line-block digest."""
    inputs = []
    for f in files:
        d = file_digest(f)
        inputs.append({"path": str(f.resolve()), "kind": "source", "digest": d.digest,
                       "unit": d.unit, "parts": len(d.parts)})
    return inputs


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the
    libc, kernel or file system lacks it."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except (OSError, TypeError):  # no C library handle (Windows)
        fn = None
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(out: Path) -> None:
    """Undo what a killed run left beside OUT: restore the previous version if the kill fell
    between the two renames of the fallback publish, and delete dead runs' staging copies."""
    if not out.parent.is_dir():
        return
    prefix = f".{out.name}."
    for p in sorted(q for q in out.parent.iterdir() if q.name.startswith(prefix)):
        kind, _, pid = p.name[len(prefix):].rpartition("-")
        if kind not in ("staging", "old") or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        if kind == "old" and not out.exists() and (p / "manifest.json").is_file():
            os.replace(p, out)
            fsync_dir(out.parent)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _publish(staging: Path, out: Path) -> None:
    """Replace OUT by STAGING so that a reader (or a SIGKILL) at any instant sees the old
    version or the new one under OUT, complete, never a mix and never nothing.

    One atomic exchange where the platform has it; the previous version is then at STAGING's
    name and is deleted last. Elsewhere two renames (OUT -> .old, STAGING -> OUT): a kill
    between them leaves OUT absent, and the next run's `recover` puts the old version back."""
    if out.is_dir() and _exchange(staging, out):
        fsync_dir(out.parent)
        shutil.rmtree(staging, ignore_errors=True)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(staging, out)
    fsync_dir(out.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def run_pipeline(config: PipelineConfig) -> PipelineResult:
    """Run the pipeline end to end; raises BadInputError / RunFailedError (exit 2) on failure."""
    recover(config.out)
    root, files = list_inputs(config.input)
    dims = load_dimensions(root)
    t_start = time.perf_counter()
    # The inputs' digests (~0.4 s of hashing at scale 10) are computed beside the engine
    # instead of inside the write stage: the local engine starts them once ingest is done, as
    # deduplication leaves a core mostly idle and ingest keeps both busy.
    ingested = threading.Event()

    def input_digests() -> list[dict[str, Any]]:
        ingested.wait()
        return _input_entries(files)

    with MemorySampler() as sampler, ThreadPoolExecutor(max_workers=1) as background:
        input_entries = background.submit(input_digests)
        meter = StageMeter(sampler)
        try:
            if config.engine == "dask":
                from scalelab.system.data.dask_engine import run_dask

                ingested.set()
                oc = run_dask(files, root, dims, config, meter)
            else:
                from scalelab.system.data.local_engine import run_local

                oc = run_local(files, root, dims, config, meter, ingested)
        finally:
            ingested.set()
        with meter.stage("write", rows_in=oc.train.height + oc.test.height) as st:
            result = _write(config, root, files, input_entries, oc, meter, t_start, st)
            st.rows_out = st.rows_in
        peak = sampler.peak
    result.stages = meter.stages
    result.dominant_stage = meter.dominant()
    result.peak_memory_bytes = peak
    result.wall_s = time.perf_counter() - t_start
    if config.register:
        from scalelab.layers.lineage.store import LineageStore

        dim_files = [root / f"{d}.csv" for d in ("weather", "planes", "airlines")
                     if (root / f"{d}.csv").is_file()]
        LineageStore(config.lineage).record(output=result.out, inputs=[*files, *dim_files],
                                            kind="dataset", input_kind="source")
    return result


def _write(config: PipelineConfig, root: Path, files: list[Path],
           input_entries: Future[list[dict[str, Any]]], oc: EngineOutput, meter: StageMeter,
           t_start: float, st: StageReport) -> PipelineResult:
    assert tuple(oc.train.columns) == FEATURE_COLUMNS
    n_train, n_test = oc.train.height, oc.test.height
    rows_out = n_train + n_test
    out = config.out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.staging-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    t0 = time.perf_counter()
    try:
        # The three tables are written at once (each writer is one thread): ~25% off this stage
        # on 2 cores. The local engine's train and test are slices of one table (split.py), so
        # writing them in turn to free the first would free nothing. The checks below run
        # while train (the longest write) is written, on the core the other writes leave
        # idle; if one fails, the staging copy is deleted and nothing is published.
        with ThreadPoolExecutor(max_workers=2) as pool:
            pending = {
                "train.parquet": pool.submit(_write_table, oc.train, staging / "train.parquet",
                                             config.row_group_size),
                "test.parquet": pool.submit(_write_table, oc.test, staging / "test.parquet",
                                            config.row_group_size)}
            q = sort_quarantine(oc.quarantine)
            pending["quarantine.parquet"] = pool.submit(
                _write_table, q, staging / "quarantine.parquet", config.row_group_size)
            q_rows = q.select("file", "row").n_unique()
            deduped = oc.exact_duplicates + oc.key_duplicates
            recon = {"rows_in": oc.rows_in, "rows_out": rows_out, "quarantined": q_rows,
                     "deduplicated": deduped,
                     "holds": oc.rows_in == rows_out + q_rows + deduped}
            if not recon["holds"]:
                raise RunFailedError(
                    f"reconciliation failed: rows_in {oc.rows_in} != rows_out {rows_out} + "
                    f"quarantined {q_rows} + deduplicated {deduped}; nothing was published "
                    "(this is a bug: report it)")
            leakage = check_leakage(oc.train, oc.test)
            fd = {name: f.result() for name, f in pending.items()}
        t1 = time.perf_counter()
        if oc.stats is not None:
            atomic_write_json(staging / "stats.json", oc.stats)
            fd["stats.json"] = file_digest(staging / "stats.json")
        fd = dict(sorted(fd.items()))
        digest = directory_digest(fd)
        t2 = time.perf_counter()
        by_rule = {r: int(n) for r, n in q.group_by("rule").len().sort("rule").iter_rows()}
        by_rc = [{"rule": r, "column": c, "records": int(n)} for r, c, n in
                 q.group_by("rule", "column").len().sort("rule", "column").iter_rows()]
        inputs = input_entries.result()
        t3 = time.perf_counter()
        st.extras.update(parquet_s=t1 - t0, output_digest_s=t2 - t1, input_digest_s=t3 - t2)
        manifest = Manifest(
            kind="dataset", name=out.name, digest=digest, rows=rows_out,
            schema={c: str(t) for c, t in oc.train.schema.items()},
            files={n: file_entry(d) for n, d in fd.items()}, inputs=inputs,
            parameters={"pipeline": "scalelab.system.data.pipeline",
                        "test_months": config.test_months,
                        "cutoff_month": oc.cutoff_month, "row_group_size": config.row_group_size,
                        "feature_columns": list(FEATURE_COLUMNS),
                        "source_root": str(root.resolve())},
            validation={"reconciliation": recon, "quarantine_by_rule": by_rule,
                        "quarantine_by_rule_column": by_rc, "quarantined_rows": q_rows,
                        "exact_duplicates": oc.exact_duplicates,
                        "key_duplicates": oc.key_duplicates, "anomalies": oc.anomalies,
                        "leakage": leakage},
            extras={"engine": config.engine, "workers": config.workers,
                    "stages": [s.__dict__ for s in meter.stages],
                    "partitions": oc.partitions})
        atomic_write_json(staging / "manifest.json", manifest.to_dict())
        _publish(staging, out)
        st.extras["manifest_publish_s"] = time.perf_counter() - t3
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PipelineResult(
        out=out, engine=config.engine, rows_in=oc.rows_in, train_rows=n_train,
        test_rows=n_test, quarantined_rows=q_rows, quarantine_records=q.height,
        exact_duplicates=oc.exact_duplicates, key_duplicates=oc.key_duplicates,
        reconciliation=recon, quarantine_by_rule=by_rule, anomalies=oc.anomalies, stages=[],
        dominant_stage=None, wall_s=time.perf_counter() - t_start, peak_memory_bytes=0,
        digest=digest, file_digests={n: d.digest for n, d in fd.items()},
        cutoff_month=oc.cutoff_month, leakage=leakage, partitions=oc.partitions,
        input_files=len(files))


def result_dict(r: PipelineResult) -> dict[str, Any]:
    """JSON-able summary of a run (what `data run --json` prints)."""
    return json.loads(json.dumps({
        "out": str(r.out), "engine": r.engine, "input_files": r.input_files,
        "rows_in": r.rows_in, "rows_out": r.rows_out, "train_rows": r.train_rows,
        "test_rows": r.test_rows, "quarantined_rows": r.quarantined_rows,
        "quarantine_records": r.quarantine_records, "quarantine_rate": r.quarantine_rate,
        "exact_duplicates": r.exact_duplicates, "key_duplicates": r.key_duplicates,
        "reconciliation": r.reconciliation, "quarantine_by_rule": r.quarantine_by_rule,
        "anomalies": r.anomalies, "cutoff_month": r.cutoff_month, "leakage": r.leakage,
        "stages": [s.__dict__ for s in r.stages], "dominant_stage": r.dominant_stage,
        "wall_s": r.wall_s, "rows_per_s": r.rows_in / r.wall_s if r.wall_s else None,
        "peak_memory_bytes": r.peak_memory_bytes, "digest": r.digest,
        "file_digests": r.file_digests, "partitions": r.partitions}, default=str))
