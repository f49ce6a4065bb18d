"""`scalelab online`: continuous ingestion apart from continuous update, on a 2013 replay.

    scalelab online schema --out schema.json
    scalelab online ingest --log log.sqlite --schema schema.json [--fault KIND@HOUR...]
    scalelab online replay --log log.sqlite --schema schema.json --policy drift [--model-repo R]
    scalelab online bench  [--policies never,monthly,weekly,daily,drift]
    scalelab online calibrate --end 2013-05-01T00 [--thresholds 25,50,...] [--budget 0.3333]
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from scalelab.cli._output import emit, json_option, plot_option, stacked
from scalelab.cli._prices import core_hour_option, prices_option, resolve_prices
from scalelab.cli._progress import live_progress

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
backoff_option = click.option(
    "--drift-backoff", default=2.0, show_default=True, type=float,
    help="After r refused candidates in a row the drift policy waits min_gap x FACTOR**r "
         "windows (at most the lookback's); 1: no back-off.")


def _stream_config(start: str | None, end: str | None, faults: tuple[str, ...],
                   label_delay: float, seed: int) -> Any:
    from scalelab.system.online.stream import ReplayConfig, parse_fault

    return ReplayConfig(start=start, end=end, faults=[parse_fault(f) for f in faults],
                        label_delay_hours=label_delay, seed=seed)


def _updater_config(bootstrap_days: float, lookback_hours: float, tick_hours: float,
                    tolerance: float, rollback_tolerance: float) -> Any:
    from scalelab.system.online.updater import UpdaterConfig
    from scalelab.system.online.window import WindowSpec

    return UpdaterConfig(bootstrap_hours=bootstrap_days * 24, tick_hours=tick_hours,
                         lookback=WindowSpec(kind="time", size=lookback_hours),
                         tolerance=tolerance, rollback_tolerance=rollback_tolerance)


Command = Callable[..., None]


def _packed(name: str, build: Callable[..., Any], options: list[Callable[[Command], Command]]
            ) -> Callable[[Command], Command]:
    """Add `options` to a command and hand it their values as one argument `name`, built by
    `build` (whose parameters are named as the options' values are)."""
    keys = tuple(inspect.signature(build).parameters)

    def decorate(f: Command) -> Command:
        @functools.wraps(f)
        def command(**kw: Any) -> None:
            value = build(*(kw.pop(k) for k in keys))
            f(**kw, **{name: value})

        return stacked(options)(command)

    return decorate


_updater_options = _packed("updater", _updater_config, [
    click.option("--bootstrap-days", default=28.0, show_default=True, type=float,
                 help="Days of labels the first model is fitted on."),
    click.option("--lookback-hours", default=168.0, show_default=True, type=float,
                 help="What each update trains on: the last N hours of labelled events."),
    click.option("--tick-hours", default=24.0, show_default=True, type=float,
                 help="The decision window: the updater acts at each close."),
    click.option("--tolerance", default=0.05, show_default=True, type=float,
                 help="Gate: largest allowed drop in accuracy, macro F1 or a class's F1."),
    click.option("--rollback-tolerance", default=0.02, show_default=True, type=float,
                 help="Roll back when live macro F1 falls this far below the previous "
                      "version's on late labels."),
])
"""The updater's options, handed to the command as one `updater` (UpdaterConfig)."""
_stream_options = _packed("stream", _stream_config,
                          [start_option, end_option, fault_option, delay_option, seed_option])
"""The replay's options, handed to the command as one `stream` (ReplayConfig)."""


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
    from scalelab.system.online.schema import write_schema

    write_schema(out, _stream_config(start, end, (), 6.0, 0))
    emit({"schema": str(out)}, as_json, lambda c: c.print(f"schema written to {out}"))


@app.command("ingest")
@click.option("--log", "log_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The event log (SQLite, WAL); created if missing.")
@click.option("--schema", "schema_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Schema JSON (from `scalelab online schema` or `scalelab data infer`).")
@_stream_options
@click.option("--batch", "batch_size", default=4096, show_default=True,
              type=click.IntRange(1, 1_000_000), help="Events per committed batch.")
@click.option("--from-start", is_flag=True,
              help="Re-send from the first event instead of resuming at the committed offset "
                   "(the id check drops what was already consumed).")
@click.option("--progress", is_flag=True,
              help="Print one line per committed batch to stderr.")
@click.option("--durable", is_flag=True, help="fsync every commit (survives power loss).")
@json_option
def ingest_cmd(log_path: Path, schema_path: Path, stream: Any, batch_size: int,
               from_start: bool, progress: bool, durable: bool, as_json: bool) -> None:
    """Validate and append the replayed events and labels to the log, exactly once per id."""
    from scalelab.system.online.ingest import ingest_stream, load_rules
    from scalelab.system.online.log import EventLog
    from scalelab.system.online.stream import build_stream

    def tell(name: str, a: Any, offset: int) -> None:
        if progress:
            sys.stderr.write(f"committed {name} batch {a.batch} offset {offset}\n")
            sys.stderr.flush()

    rules = load_rules(schema_path)
    replay = build_stream(stream)
    with EventLog(log_path, durable=durable) as log:
        sums = ingest_stream(log, rules, replay, batch_size=batch_size, resume=not from_start,
                             on_commit=tell)
    out: dict[str, Any] = {"log": str(log_path), "stream": replay.manifest(), **sums}

    def render(c: Console) -> None:
        for name in ("events", "labels"):
            s = out[name]
            c.print(f"{name}: received {s['received']:,}, accepted {s['accepted']:,}, "
                    f"quarantined {s['quarantined']:,}, duplicates {s['duplicates']:,} in "
                    f"{s['batches']} batches ({s['wall_s']:.2f} s); log holds "
                    f"{s['totals']['consumed_ids']:,} ids")

    emit(out, as_json, render)


def _one_torch_thread() -> None:
    """Fine-tunes of a ~10k-parameter MLP in batches of 256 are fastest on one thread (a
    second one mostly waits), and the other cores stay with ingestion or a server."""
    import torch

    torch.set_num_threads(1)


def plot_monthly(results: list[dict[str, Any]], path: Path) -> None:
    """F1 over time per policy, from each result's `monthly` (as the JSON gives it)."""
    from scalelab.lab.report import figures

    series = {r["policy"]: [(float(m["month"]), float(m["macro_f1"])) for m in r["monthly"]]
              for r in results}
    figures.save(figures.timeline_figure(
        series, xlabel="month of 2013 (prediction time)", ylabel="prequential macro F1",
        title="online: quality over time per update policy"), path)


@app.command("replay")
@click.option("--log", "log_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The event log; ingested first when empty.")
@click.option("--schema", "schema_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Schema JSON.")
@click.option("--policy", default="drift", show_default=True,
              help="never, monthly, weekly, daily, every-K (K windows) or drift.")
@click.option("--drift-threshold", default=50.0, show_default=True, type=float,
              help="Page-Hinkley threshold (errors of evidence) of the drift policy.")
@backoff_option
@click.option("--model-repo", default=None, type=click.Path(path_type=Path, file_okay=False),
              help="Publish versions here through `scalelab serve canary/promote/rollback`.")
@click.option("--model", "model_name", default="flights-online", show_default=True,
              help="Model name in --model-repo (must be new).")
@click.option("--label-horizon-hours", "label_horizon", default=None, type=float,
              help="Labels arriving later than this after their event are counted "
                   "(labels.past_horizon) and not used; default: every label is used.")
@click.option("--decisions", "decisions_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Write every decision as one JSON line here.")
@click.option("--records", "records_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Append the run's measurement record (JSON Lines) here.")
@_updater_options
@_stream_options
@plot_option("macro F1 per month of prediction")
@json_option
def replay_cmd(log_path: Path, schema_path: Path, policy: str, drift_threshold: float,
               drift_backoff: float,
               model_repo: Path | None, model_name: str, label_horizon: float | None,
               decisions_path: Path | None,
               records_path: Path | None, updater: Any, stream: Any, plot: Path | None,
               as_json: bool) -> None:
    """Replay end to end: ingest (if the log is empty), then update under review, prequential."""
    from scalelab.lab.core.records import append_records
    from scalelab.system.online.ingest import load_rules
    from scalelab.system.online.policy import make_policy
    from scalelab.system.online.publish import RepositoryPublisher
    from scalelab.system.online.replay import replay, write_decisions

    _one_torch_thread()
    rules = load_rules(schema_path)
    pol = make_policy(policy, threshold=drift_threshold, backoff=drift_backoff,
                      max_wait=updater.lookback_windows())
    pub = None if model_repo is None else \
        RepositoryPublisher(model_repo, model_name, tolerance=updater.tolerance)
    with live_progress(f"replay {policy}") as progress:
        done = replay(log_path, rules, policy, pol, updater, stream,
                      label_horizon_h=label_horizon, publisher=pub,
                      on_window=lambda k, n: progress.update(
                          completed=k, total=n, note=f"replay {policy}: window {k}/{n}"))
    result, data = done.result, done.data
    if decisions_path is not None:
        write_decisions(decisions_path, result)
    if records_path is not None:
        append_records(records_path, [done.record(updater.tick_hours)])
    out = {**done.summary(log_path), "plot": str(plot) if plot else None}
    if plot is not None:
        plot_monthly([out], plot)

    def render(c: Console) -> None:
        c.print(f"policy {policy}: prequential macro F1 {result.macro_f1:.4f}, accuracy "
                f"{result.accuracy:.4f} on {result.scored:,} late labels")
        c.print(f"updates: {result.promoted} promoted, {result.refused} refused, "
                f"{result.rolled_back} rolled back; {result.quarantined_windows} window(s) "
                f"quarantined; {result.samples_trained:,} samples trained "
                f"({result.train_cpu_s:.1f} CPU s); mean staleness {result.staleness_h:.0f} h")
        c.print(f"labels: {data.labels_joined:,} used, {data.past_horizon:,} past the "
                f"horizon, {data.unjoined:,} for events not in the log")
        c.print(f"feature version {result.feature_version}"
                + (f"; decisions in {decisions_path}" if decisions_path else ""))

    emit(out, as_json, render)


@app.command("bench")
@click.option("--out", "out_dir", default=Path("scalelab-out/online"), show_default=True,
              type=click.Path(path_type=Path, file_okay=False), help="Work folder.")
@click.option("--policies", default="never,monthly,weekly,daily,drift", show_default=True,
              help="Comma-separated policies.")
@click.option("--drift-threshold", default=50.0, show_default=True, type=float)
@backoff_option
@prices_option
@core_hour_option
@click.option("--records", "records_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Append one record per policy (JSON Lines) here.")
@_updater_options
@_stream_options
@plot_option("macro F1 per month of prediction, one line per policy")
@json_option
def bench_cmd(out_dir: Path, policies: str, drift_threshold: float, drift_backoff: float,
              prices_file: Path | None,
              price_per_core_hour: float | None,
              records_path: Path | None, updater: Any, stream: Any, plot: Path | None,
              as_json: bool) -> None:
    """Prequential quality and compute per update policy on one replay, side by side."""
    from scalelab.cli._output import parse_list
    from scalelab.lab.core.records import append_records, new_experiment_id
    from scalelab.system.online.bench import OnlineBenchConfig, compare_policies, run_bench

    _one_torch_thread()
    cfg = OnlineBenchConfig(policies=parse_list(policies, what="--policies", kind=str),
                            stream=stream,
                            updater=updater,
                            drift_threshold=drift_threshold, drift_backoff=drift_backoff,
                            price_per_core_hour=resolve_prices(
                                prices_file, core_hour_usd=price_per_core_hour).core_hour_usd)
    with live_progress("online bench: ingest") as progress:

        def on_window(name: str, k: int, n: int) -> None:
            i = cfg.policies.index(name)
            progress.update(completed=i * n + k, total=n * len(cfg.policies),
                            note=f"policy {name}: window {k}/{n}")

        res = run_bench(cfg, out_dir, new_experiment_id("online"), on_window=on_window)
    if records_path is not None:
        append_records(records_path, res["records"])
    rows = [p["result"] for p in res["policies"]]
    out = {k: v for k, v in res.items() if k not in ("records", "policies")}
    out["results"] = rows
    out["drift_vs_best_fixed"] = compare_policies(rows)
    out["plot"] = str(plot) if plot else None
    if plot is not None:
        plot_monthly(rows, plot)

    def render(c: Console) -> None:
        from rich.table import Table

        t = Table(title=f"online: {res['span_days']:.0f} days replayed, "
                        f"{res['ingest']['events']['received']:,} events")
        for col in ("policy", "macro F1", "accuracy", "updates/30d", "promoted", "refused",
                    "rolled back", "update samples", "train CPU s", "staleness h"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(r["policy"], f"{r['macro_f1']:.4f}", f"{r['accuracy']:.4f}",
                      f"{r['updates_per_30d']:.2f}", str(r["promoted"]), str(r["refused"]),
                      str(r["rolled_back"]), f"{r['update_samples']:,}",
                      f"{r['train_cpu_s']:.1f}", f"{r['staleness_h']:.0f}")
        c.print(t)
        ev = res["ingest"]["events"]
        c.print(f"ingestion: {ev['events_per_s']:,.0f} events/s ({ev['events_per_cpu_s']:,.0f} "
                "per CPU second)")
        cmp_ = out["drift_vs_best_fixed"]
        if cmp_:
            c.print(f"drift: {-cmp_['gap_points']:+.2f} macro-F1 points vs the best fixed period "
                    f"({cmp_['best_fixed']}) at {cmp_['compute_ratio']:.2f}x its update compute")

    emit(out, as_json, render)


@app.command("calibrate")
@click.option("--out", "out_dir", default=Path("scalelab-out/online-calibration"),
              show_default=True, type=click.Path(path_type=Path, file_okay=False),
              help="Work folder (the calibration period's own log and schema).")
@click.option("--thresholds", default="25,50,100,150,200,300,400", show_default=True,
              help="Page-Hinkley thresholds tried (errors of evidence).")
@click.option("--references", default="monthly,weekly,daily", show_default=True,
              help="Fixed periods; the best by macro F1 sets the budget.")
@click.option("--budget", default=1 / 3, show_default="0.3333", type=float,
              help="Largest update compute allowed, as a share of the best fixed period's.")
@backoff_option
@click.option("--schema", "schema_path", default=None,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Schema JSON; default: inferred from the calibration period itself.")
@click.option("--records", "records_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Append one record per replayed policy (JSON Lines) here.")
@_updater_options
@start_option
@end_option
@delay_option
@seed_option
@json_option
def calibrate_cmd(out_dir: Path, thresholds: str, references: str, budget: float,
                  drift_backoff: float,
                  schema_path: Path | None, records_path: Path | None, updater: Any,
                  start: str | None, end: str | None, label_delay: float, seed: int,
                  as_json: bool) -> None:
    """Choose the drift threshold on a calibration period (--start/--end: one the evaluation
    will not replay): the best macro F1 within --budget of the best fixed period's update
    compute. Then replay or bench with --policy drift:T."""
    from scalelab.cli._output import parse_list
    from scalelab.lab.core.records import append_records, new_experiment_id
    from scalelab.system.online.bench import OnlineBenchConfig
    from scalelab.system.online.calibrate import CalibrationConfig, run_calibration

    _one_torch_thread()
    ccfg = CalibrationConfig(thresholds=parse_list(thresholds, what="--thresholds"),
                             references=parse_list(references, what="--references", kind=str),
                             budget=budget)
    bench = OnlineBenchConfig(stream=_stream_config(start, end, (), label_delay, seed),
                              updater=updater,
                              schema=schema_path, drift_backoff=drift_backoff)
    choice, res = run_calibration(ccfg, bench, out_dir, new_experiment_id("online-calibrate"))
    if records_path is not None:
        append_records(records_path, res["records"])
    out = {**choice.to_dict(), "period": {"start": start, "end": end},
           "span_days": res["span_days"], "stream": res["stream"]}

    def render(c: Console) -> None:
        for t in choice.trials:
            mark = "  <- chosen" if t.policy == choice.policy else ""
            c.print(f"{t.policy:>10}  macro F1 {t.macro_f1:.4f}  update samples "
                    f"{t.update_samples:>10,d}{mark}")
        c.print(f"{choice.reason}; best fixed period {choice.reference} "
                f"({choice.reference_macro_f1:.4f}); threshold {choice.threshold:g}: "
                f"use --policy {choice.policy}")

    emit(out, as_json, render)
