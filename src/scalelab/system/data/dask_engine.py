"""The Dask engine: the same per-partition polars functions, run as distributed futures.

Plan (two waves of tasks, then the writer on the client):

1. one task per input file: ingest + validate, then split the valid rows into `partitions` hash
   buckets of the flight key (dedupe.bucket_of), so every row of a key lands in one bucket;
2. one task per bucket: concatenate its pieces from every file, deduplicate, join the
   dimension tables (scattered once to every worker: broadcast), build features, split by time
   and compute mergeable statistics of its train and test rows;
3. the client gathers the pieces, merges the statistics (data/stats.py `merge_all`), sorts and
   writes exactly as the local engine does — hence identical bytes and digests.

Without --address, a LocalCluster of `workers` processes (1 thread each) is started and closed.
Reported per partition: rows and seconds of every task, skew = max/median of rows and of
seconds per wave, and spill from each worker's SpillBuffer (bytes in memory/on disk now, plus
its cumulative disk-write/read metrics).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import BadInputError, RunFailedError
from scalelab.system.data.dedupe import bucket_of, deduplicate
from scalelab.system.data.engine import EngineOutput, stats_document
from scalelab.system.data.features import INPUT_COLUMNS, Dimensions, build_features
from scalelab.system.data.ingest import file_name, ingest_file
from scalelab.system.data.meter import StageMeter
from scalelab.system.data.quarantine import validate
from scalelab.system.data.split import split_by_time


def _ingest_task(path: str, root: str, names: list[str], dims: Dimensions, n_buckets: int
                 ) -> dict[str, Any]:
    t0 = time.perf_counter()
    ing = ingest_file(Path(path), Path(root), names)
    good, q = validate(ing.frame, carriers=dims.carriers, origins=dims.origins)
    good = good.with_columns(bucket_of(n_buckets).alias("__bucket"))
    buckets = {b: good.filter(pl.col("__bucket") == b).drop("__bucket")
               for b in range(n_buckets)}
    return {"buckets": buckets, "quarantine": pl.concat([ing.quarantine, q]),
            "rows_in": ing.rows_in, "rows_valid": good.height, "anomalies": ing.anomalies,
            "seconds": time.perf_counter() - t0, "file": path}


def _bucket_task(bucket: int, dims: Dimensions, test_months: int, with_stats: bool,
                 *pieces: pl.DataFrame) -> dict[str, Any]:
    t0 = time.perf_counter()
    frame = pl.concat(list(pieces))
    dd = deduplicate(frame, keep_columns=INPUT_COLUMNS)
    feats = build_features(dd.frame, dims, test_months=test_months)
    sp = split_by_time(feats, test_months=test_months, ordered=True)
    stats: tuple[Any, Any] | None = None
    if with_stats:
        from scalelab.system.data.stats import compute_stats

        stats = (compute_stats(sp.train), compute_stats(sp.test))
    return {"bucket": bucket, "train": sp.train, "test": sp.test, "quarantine": dd.quarantine,
            "exact": dd.exact_duplicates, "key": dd.key_duplicates, "rows_in": frame.height,
            "stats": stats, "cutoff": sp.cutoff_month, "seconds": time.perf_counter() - t0}


def _spill(dask_worker: Any) -> dict[str, Any]:
    import psutil

    data = dask_worker.data
    out: dict[str, Any] = {"rss_bytes": psutil.Process().memory_info().rss}
    total = getattr(data, "spilled_total", None)
    if total is not None:
        out["spilled_memory_bytes"] = int(total.memory)
        out["spilled_disk_bytes"] = int(total.disk)
    metrics = getattr(data, "cumulative_metrics", None)
    if metrics:
        out["cumulative"] = {f"{k[0]}:{k[1]}": float(v) for k, v in metrics.items()}
    return out


def skew(values: list[float]) -> float | None:
    """max / median (1.0 = perfectly even); None when the median is 0 or there are no values."""
    if not values:
        return None
    med = statistics.median(values)
    return max(values) / med if med > 0 else None


def _client(address: str | None, workers: int) -> tuple[Any, Any]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as e:  # Dask is an extra: the base install leaves it out.
        raise BadInputError("--engine dask needs Dask, which the base install leaves out; "
                            "run: pip install 'scalelab[dask]' (or use --engine local)") from e
    if address:
        try:
            return Client(address, timeout="10s"), None
        except OSError as e:
            raise BadInputError(f"--address {address}: no Dask scheduler answers ({e}); "
                                "start one (dask scheduler) or drop --address") from e
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=50)
    return Client(cluster), cluster


def run_dask(files: list[Path], root: Path, dims: Dimensions, config: Any,
             meter: StageMeter) -> Any:
    """Run the pipeline on Dask; returns pipeline.EngineOutput."""
    from scalelab.lab.core.machine import available_cores

    workers = config.workers or available_cores()
    with meter.stage("cluster") as st:
        client, cluster = _client(config.address, workers)
        st.extras["workers"] = len(client.nthreads())
    if config.address:
        workers = max(1, st.extras["workers"])
    n_buckets = config.partitions or 2 * workers
    try:
        with meter.stage("ingest_validate") as st:
            dims_f = client.scatter(dims, broadcast=True)
            names = [file_name(f, root) for f in files]
            ing = [client.submit(_ingest_task, str(f), str(root), names, dims_f, n_buckets,
                                 pure=False) for f in files]
            # Small per-file metadata comes back; the buckets stay on the workers.
            meta = client.gather([client.submit(
                lambda r: {k: v for k, v in r.items() if k != "buckets"}, f, pure=False)
                for f in ing])
            st.rows_in = sum(m["rows_in"] for m in meta)
            st.rows_out = sum(m["rows_valid"] for m in meta)
        with meter.stage("dedupe_features_split", rows_in=st.rows_out) as st:
            outs = []
            for b in range(n_buckets):
                pieces = [client.submit(lambda r, b=b: r["buckets"][b], f, pure=False)
                          for f in ing]
                outs.append(client.submit(_bucket_task, b, dims_f, config.test_months,
                                          config.stats, *pieces, pure=False))
            res = client.gather(outs)
            st.rows_out = sum(r["train"].height + r["test"].height for r in res)
        with meter.stage("merge", rows_in=st.rows_out) as st:
            train = pl.concat([r["train"] for r in res])
            test = pl.concat([r["test"] for r in res])
            train = train.sort("time_hour", "flight_key")
            test = test.sort("time_hour", "flight_key")
            stats = None
            if config.stats:
                stats = stats_document(train=[r["stats"][0] for r in res],
                                       test=[r["stats"][1] for r in res])
            st.rows_out = train.height + test.height
        spill = client.run(_spill)
    except (OSError, TimeoutError) as e:
        raise RunFailedError(f"the Dask cluster failed ({type(e).__name__}: {e}); "
                             "check the workers' logs and memory") from e
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    ing_rows = [float(m["rows_in"]) for m in meta]
    ing_s = [float(m["seconds"]) for m in meta]
    b_rows = [float(r["rows_in"]) for r in res]
    b_s = [float(r["seconds"]) for r in res]
    partitions = {
        "workers": workers, "buckets": n_buckets,
        "ingest": [{"file": Path(m["file"]).name, "rows": m["rows_in"], "seconds": m["seconds"]}
                   for m in meta],
        "bucket": [{"bucket": r["bucket"], "rows": r["rows_in"], "seconds": r["seconds"]}
                   for r in res],
        "skew": {"ingest_rows": skew(ing_rows), "ingest_seconds": skew(ing_s),
                 "bucket_rows": skew(b_rows), "bucket_seconds": skew(b_s)},
        "spill": {str(k): v for k, v in spill.items()},
        "spilled_disk_bytes": sum(int(v.get("spilled_disk_bytes", 0)) for v in spill.values()),
    }
    q = pl.concat([m["quarantine"] for m in meta] + [r["quarantine"] for r in res])
    return EngineOutput(
        rows_in=sum(m["rows_in"] for m in meta), train=train, test=test, quarantine=q,
        exact_duplicates=sum(r["exact"] for r in res), key_duplicates=sum(r["key"] for r in res),
        anomalies=[a for m in meta for a in m["anomalies"]],
        cutoff_month=res[0]["cutoff"] if res else 13 - config.test_months, stats=stats,
        partitions=partitions)

