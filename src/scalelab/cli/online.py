"""`scalelab online`: continuous ingestion apart from continuous update, on a 2013 replay.

    scalelab online schema --out schema.json
    scalelab online ingest --log log.sqlite --schema schema.json [--fault KIND@HOUR...]
    scalelab online replay --log log.sqlite --schema schema.json --policy drift [--model-repo R]
    scalelab online bench  [--policies never,monthly,weekly,daily,drift]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from scalelab.cli._output import emit, json_option

start_option = click.option("--start", default=None,
                            help="First hour replayed, ISO (e.g. 2013-01-01T00); default: all.")
end_option = click.option("--end", default=None,
                          help="Hour the replay stops before, ISO; default: end of 2013.")
fault_option = click.option(
    "--fault", "faults", multiple=True,
    help="Inject a seeded fault: corrupt@2013-03-14T15, label_flip@2013-05-01T00:hours=48, "
         "rescale@2013-07-01T00:hours=720:column=distance:scale=1.609 (repeatable).")
delay_option = click.option("--label-delay", default=6.0, show_default=True, type=float,
                            help="Hours after departure before a flight's label arrives.")
seed_option = click.option("--seed", default=0, show_default=True, type=int)


def _stream_config(start: str | None, end: str | None, faults: tuple[str, ...],
                   label_delay: float, seed: int) -> Any:
    from scalelab.online.stream import StreamConfig, parse_fault

    return StreamConfig(start=start, end=end, faults=[parse_fault(f) for f in faults],
                        label_delay_hours=label_delay, seed=seed)


@click.group(no_args_is_help=True)
def app() -> None:
    """Online learning under review: replay, ingest, update, evaluate, promote, roll back."""


@app.command("schema")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the schema JSON.")
@start_option
@end_option
@json_option
def schema_cmd(out: Path, start: str | None, end: str | None, as_json: bool) -> None:
    """Infer the feature events' schema with `scalelab data infer` (clean stream)."""
    from scalelab.online.schema import write_schema

    write_schema(out, _stream_config(start, end, (), 6.0, 0))
    emit({"schema": str(out)}, as_json, lambda c: c.print(f"schema written to {out}"))


@app.command("ingest")
@click.option("--log", "log_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The event log (SQLite, WAL); created if missing.")
@click.option("--schema", "schema_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Schema JSON (from `scalelab online schema` or `scalelab data infer`).")
@start_option
@end_option
@fault_option
@delay_option
@seed_option
@click.option("--batch", "batch_size", default=4096, show_default=True,
              type=click.IntRange(1, 1_000_000), help="Events per committed batch.")
@click.option("--from-start", is_flag=True,
              help="Re-send from the first event instead of resuming at the committed offset "
                   "(the id check drops what was already consumed).")
@click.option("--progress", is_flag=True,
              help="Print one line per committed batch to stderr.")
@click.option("--durable", is_flag=True, help="fsync every commit (survives power loss).")
@json_option
def ingest_cmd(log_path: Path, schema_path: Path, start: str | None, end: str | None,
               faults: tuple[str, ...], label_delay: float, seed: int, batch_size: int,
               from_start: bool, progress: bool, durable: bool, as_json: bool) -> None:
    """Validate and append the replayed events and labels to the log, exactly once per id."""
    import time

    from scalelab.online.ingest import ingest_source, load_rules
    from scalelab.online.log import EventLog
    from scalelab.online.stream import build_stream

    rules = load_rules(schema_path)
    stream = build_stream(_stream_config(start, end, faults, label_delay, seed))
    out: dict[str, Any] = {"log": str(log_path), "stream": stream.manifest()}
    with EventLog(log_path, durable=durable) as log:
        for name, source in (("events", stream.feature_events()),
                             ("labels", stream.label_events())):
            def tell(a: Any, offset: int, name: str = name) -> None:
                if progress:
                    sys.stderr.write(f"committed {name} batch {a.batch} offset {offset}\n")
                    sys.stderr.flush()

            t0, c0 = time.perf_counter(), time.process_time()
            sums = ingest_source(log, rules, name, source, batch_size=batch_size,
                                 resume=not from_start, on_commit=tell)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out[name] = {**sums, "wall_s": wall, "cpu_s": cpu,
                         "events_per_s": sums["received"] / wall if wall > 0 else None,
                         "totals": log.totals(name)}

    def render(c: Console) -> None:
        for name in ("events", "labels"):
            s = out[name]
            c.print(f"{name}: received {s['received']:,}, accepted {s['accepted']:,}, "
                    f"quarantined {s['quarantined']:,}, duplicates {s['duplicates']:,} in "
                    f"{s['batches']} batches ({s['wall_s']:.2f} s); log holds "
                    f"{s['totals']['consumed_ids']:,} ids")

    emit(out, as_json, render)
