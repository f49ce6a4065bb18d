"""The local engine of `scalelab data run`: one process, file groups on two threads.

Polars runs multi-threaded inside each stage; pipeline.py runs this engine and writes its
outcome; dask_engine.py is the many-machine counterpart with the same results."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.machine import available_cores
from scalelab.layers.nets.flights import LABEL
from scalelab.system.data.dedupe import deduplicate, delay_class, key_hash
from scalelab.system.data.engine import EngineOutput, PipelineConfig, compute, stats_document
from scalelab.system.data.features import INPUT_COLUMNS, Dimensions, build_features
from scalelab.system.data.ingest import file_name, ingest_file, ingest_plain_group
from scalelab.system.data.meter import StageMeter, StageReport
from scalelab.system.data.quarantine import validate
from scalelab.system.data.split import split_by_time

INGEST_THREADS = 2
"""File groups ingested and validated at once by the local engine (at most the cores)."""
GROUP_BYTES = 16 * 2**20
"""Input bytes (~170k flights) the local engine validates in one query."""


@dataclass(kw_only=True)
class _GroupResult:
    """What ingest + validate of a few files leaves (their text frames are already dropped)."""

    rows_in: int
    rows_sound: int
    good: pl.DataFrame
    quarantine: list[pl.DataFrame]
    anomalies: list[dict[str, Any]]
    ingest_s: float
    validate_s: float


def file_groups(files: list[Path], max_bytes: int = GROUP_BYTES) -> list[list[Path]]:
    """Consecutive files, in order, grouped until a group holds MAX_BYTES (or one file)."""
    groups: list[list[Path]] = []
    size = max_bytes
    for f in files:
        if size >= max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += f.stat().st_size
    return groups


def _ingest_validate(paths: list[Path], root: Path, names: list[str], dims: Dimensions
                     ) -> _GroupResult:
    t0 = time.perf_counter()
    # One read of the whole group when its files allow (ingest_plain_group): ~13% less time
    # for ingest + validate at scale 10 than one read per file.
    group = ingest_plain_group(paths, root, names)
    ings = [group] if group is not None else [ingest_file(p, root, names) for p in paths]
    t1 = time.perf_counter()
    frame = pl.concat([i.frame for i in ings])
    good, q = validate(frame, carriers=dims.carriers, origins=dims.origins)
    # Computed here, two groups at once, deduplication's label and key hash were ~0.35 s of
    # its ~1 s on one thread at scale 10 (+ 9 bytes a row until then).
    good = good.with_columns(delay_class().alias(LABEL), key_hash())
    # One chunk per group, made here in parallel: deduplication over ~8 chunks a group
    # rechunked the whole table at once (~0.3 GB more peak memory at scale 10, and slower).
    return _GroupResult(rows_in=sum(i.rows_in for i in ings), rows_sound=frame.height,
                        good=good.rechunk(), quarantine=[*(i.quarantine for i in ings), q],
                        anomalies=[a for i in ings for a in i.anomalies], ingest_s=t1 - t0,
                        validate_s=time.perf_counter() - t1)


def run_local(files: list[Path], root: Path, dims: Dimensions, config: PipelineConfig,
              meter: StageMeter, ingested: threading.Event | None = None) -> EngineOutput:
    """One process, polars multi-threaded inside each stage; sets INGESTED when every file has
    been read."""

    # Files are ingested and validated a group at a time so only typed valid rows accumulate
    # (the text frame of a whole scale-10 run would be ~3x larger); each later stage drops its
    # input as soon as it is done, so peak memory is about one stage's input + output.
    # Validation is one polars query per group, not per file: its fixed cost per call was
    # ~40% of it on 28k-row files. Two groups run at once: polars runs such a group mostly on
    # one thread, so the second keeps the other core busy (~30% less wall time on 2 cores).
    # The two stages then overlap: each gets the loop's wall time in proportion to its summed
    # per-group time.
    ing_rep, val_rep = StageReport(name="ingest"), StageReport(name="validate")
    goods: list[pl.DataFrame] = []
    quarantines: list[pl.DataFrame] = []
    anomalies: list[dict[str, Any]] = []
    names = [file_name(f, root) for f in files]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(INGEST_THREADS, available_cores()))) as pool:
        for r in pool.map(lambda g: _ingest_validate(g, root, names, dims), file_groups(files)):
            ing_rep.rows_in += r.rows_in
            ing_rep.rows_out += r.rows_sound
            val_rep.rows_in += r.rows_sound
            val_rep.rows_out += r.good.height
            ing_rep.seconds += r.ingest_s
            val_rep.seconds += r.validate_s
            goods.append(r.good)
            quarantines += r.quarantine
            anomalies += r.anomalies
    if ingested is not None:
        ingested.set()
    meter.sampler.sample()
    t1 = time.perf_counter()
    busy = ing_rep.seconds + val_rep.seconds
    ing_rep.seconds = (t1 - t0) * ing_rep.seconds / busy if busy else 0.0
    val_rep.seconds = (t1 - t0) - ing_rep.seconds
    ing_rep.peak_memory_bytes = val_rep.peak_memory_bytes = meter.window(t0, t1)
    meter.add(ing_rep)
    meter.add(val_rep)
    good = pl.concat(goods)
    del goods
    with meter.stage("dedupe", rows_in=good.height) as st:
        dd = deduplicate(good, keep_columns=INPUT_COLUMNS)
        del good
        st.rows_out = dd.frame.height
    with meter.stage("features", rows_in=dd.frame.height) as st:
        feats = build_features(dd.frame, dims, test_months=config.test_months)
        q_dedupe, exact, keyd = dd.quarantine, dd.exact_duplicates, dd.key_duplicates
        del dd
        st.rows_out = feats.height
    with meter.stage("split", rows_in=feats.height) as st:
        sp = split_by_time(feats, test_months=config.test_months, ordered=True)
        del feats
        st.rows_out = sp.train.height + sp.test.height
    stats = None
    if config.stats:
        with meter.stage("stats", rows_in=st.rows_out) as st2:
            stats = stats_document(train=[compute(sp.train)], test=[compute(sp.test)])
            st2.rows_out = st2.rows_in
    q = pl.concat([*quarantines, q_dedupe])
    return EngineOutput(rows_in=ing_rep.rows_in, train=sp.train, test=sp.test, quarantine=q,
                   exact_duplicates=exact, key_duplicates=keyd,
                   anomalies=anomalies, cutoff_month=sp.cutoff_month, stats=stats)
