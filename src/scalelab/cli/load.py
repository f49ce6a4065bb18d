"""`scalelab load URL` (run levels), `load capacity URL` (SLO capacity search), `load budget`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import psutil
from rich import box
from rich.console import Console
from rich.table import Table

from scalelab.cli._arrival import resolve as resolve_arrival
from scalelab.cli._capacity import (
    availability_doc,
    availability_line,
    budget_option,
    deadline,
    unconfirmed,
)
from scalelab.cli._cluster import cluster_option, open_cluster
from scalelab.cli._export import levels_plot_option, output_option
from scalelab.cli._gate import exit_if_missed
from scalelab.cli._load_requests import (
    build_requests,
    check_ran,
    engine_config,
    exit_if_all_failed,
    failures_cell,
    header_names,
    request_options,
)
from scalelab.cli._output import DefaultGroup, emit, err_console, json_option
from scalelab.cli._progress import live_progress
from scalelab.cli._progress import shown as progress_shown
from scalelab.cli._sweep import (
    each_level,
    fraction,
    lengths,
    level_of,
    level_options,
    levels,
)
from scalelab.cli._sweep import fmt_ms as _ms
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.objectives import parse_percent
from scalelab.lab.core.records import append_records, new_experiment_id, read_records
from scalelab.lab.core.signals import LATENCY_HISTOGRAM
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.capacity import CONFIRM_S, CapacityResult, SearchConfig, StepRule
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.result import (
    LAG_FLOOR_S,
    LAG_OBJECTIVE_SHARE,
    RATE_TOLERANCE,
    LoadResult,
    to_record,
)
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.http.search import HttpSearch
from scalelab.lab.load.result import DEFAULT_AVAILABILITY
from scalelab.lab.load.schedule import ARRIVALS
from scalelab.lab.load.server.reader import level_signals, start_reader
from scalelab.lab.load.server_meter import ServerMeter
from scalelab.lab.load.slo import Slo, budget, parse_slo

VALIDITY_RULES = {"rate_tolerance": RATE_TOLERANCE, "lag_p99_floor_ms": LAG_FLOOR_S * 1e3,
                  "lag_p99_max_gaps": 1.0, "lag_p99_max_objective_share": LAG_OBJECTIVE_SHARE}
"""What `result.validity` checks, echoed in --json so a reader can judge the flags."""


@click.group(cls=DefaultGroup)
def app() -> None:
    """Load-test an HTTP endpoint: `scalelab load URL`, `load capacity URL`, `load budget`."""


@app.command("run")
@click.argument("url")
@level_options(rate_help="Open loop: arrivals per second.",
               concurrency_help="Closed loop: clients (a comma list sweeps).",
               loop_default="open", loop_help="With --base: sweep rates (open) or concurrency "
               "(closed).", multiples_help="With --base: the multiples.",
               processes_help="Generator processes (for rates one process cannot offer).")
@click.option("--slo", help='Objectives for goodput and error budgets, e.g. "p95<50ms".')
@click.option("--error-budget", help="Availability budget, e.g. 0.1%.")
@click.option("--period", default="30d", show_default=True, help="SLO period for budgets.")
@click.option("--records", type=click.Path(path_type=Path), help="Append one record per level.")
@click.option("--experiment", help="Experiment id for the records (default: generated).")
@click.option("--no-cold-start", is_flag=True, help="Skip the first-request probe.")
@click.option("--server-pid", type=int,
              help="Meter this local server process tree across each level: its CPU seconds "
                   "and peak resident memory go into the level's record (server_cpu_s, "
                   "server_peak_rss_bytes).")
@click.option("--metrics-url", "server_metrics",
              help="With --server-pid: the server's /metrics URL; its "
                   "scalelab_responses_total before and after each level gives the level's "
                   "server_responses.")
@click.option("--server-metrics", "server_metrics_old", hidden=True,
              help="Old spelling of --metrics-url.")
@click.option("--server-signals", is_flag=True,
              help="Read the server's side of each level into its record: its /metrics "
                   "(process_* metrics; vLLM, SGLang, TGI, llama.cpp, Triton, Ray Serve names) "
                   "and, for a local server, its process tree (--server-pid, or found from the "
                   "port).")
@click.option("--prometheus", metavar="URL",
              help="A Prometheus server to ask for the node_exporter, cAdvisor and DCGM series "
                   "of each level's window (implies --server-signals).")
@click.option("--trace-at", type=float,
              help="Mark requests with --trace-sample only at this level (a rate, or clients "
                   "with --concurrency); default: at every level.")
@cluster_option
@request_options
@levels_plot_option("latency")
@output_option
@json_option
def run(url: str, rate: float | None, rates: str | None, concurrency: str | None,
        base: float | None, loop: str, multiples: str, arrival: str, duration: str | None,
        n_requests: int | None, warmup: str, processes: int, slo: str | None,
        error_budget: str | None, period: str, records: Path | None, experiment: str | None,
        no_cold_start: bool, server_pid: int | None, server_metrics: str | None,
        server_metrics_old: str | None, server_signals: bool, prometheus: str | None,
        trace_at: float | None, cluster_address: str | None, as_json: bool,
        **kw: Any) -> None:
    """Offer load to URL at each level; print percentiles, throughput, goodput, errors, lag.

    \b
    Exit status: 0 done, every given objective met; 1 an objective was missed (printed on
    stderr after the output); 2 bad usage or input; 70 internal error; 130 interrupted.
    """
    arrival, rate, duration = resolve_arrival(kw, arrival=arrival, rate=rate, rates=rates,
                                              concurrency=concurrency, duration=duration,
                                              n_requests=n_requests, warmup=warmup)
    meter = server_meter(server_pid, server_metrics or server_metrics_old)
    with open_cluster(cluster_address) as cluster:
        _run(url, rate, rates, concurrency, base, loop, multiples, arrival, duration, n_requests,
             warmup, processes, slo, error_budget, period, records, experiment, no_cold_start,
             as_json, kw, cluster, meter=meter, trace_at=trace_at,
             server_side=(server_signals, server_pid, prometheus))


def server_meter(pid: int | None, metrics: str | None) -> ServerMeter | None:
    """The meter of --server-pid (bad usage: a process that is not running, or
    --metrics-url alone)."""
    if pid is None:
        if metrics:
            raise BadUsageError("--metrics-url needs --server-pid PID (the server it "
                                "counts responses of)")
        return None
    if not psutil.pid_exists(pid):
        raise BadUsageError(f"--server-pid {pid}: no such process on this machine; give the "
                            "pid of the local server under load")
    return ServerMeter(pid=pid, metrics_url=metrics)


def _run(url: str, rate: float | None, rates: str | None, concurrency: str | None,
         base: float | None, loop: str, multiples: str, arrival: str, duration: str | None,
         n_requests: int | None, warmup: str, processes: int, slo: str | None,
         error_budget: str | None, period: str, records: Path | None, experiment: str | None,
         no_cold_start: bool, as_json: bool, kw: dict[str, Any],
         cluster: Cluster | None, *, meter: ServerMeter | None = None,
         trace_at: float | None = None,
         server_side: tuple[bool, int | None, str | None] = (False, None, None)) -> None:
    mode, sweep = levels(rate, rates, concurrency, base, loop, multiples)
    if trace_at is not None and trace_at not in sweep:
        raise BadUsageError(f"--trace-at {trace_at:g} is not one of the levels "
                            f"({', '.join(f'{x:g}' for x in sweep)})")
    dur, warm = lengths(duration, n_requests, warmup)
    objective = parse_slo(slo, error_budget=error_budget) if (slo or error_budget) else None
    period_s = parse_duration(period, what="--period")
    target, reqs, kind = build_requests(url, kw)
    exp = experiment or new_experiment_id("load")
    out: list[dict[str, Any]] = []
    results: list[LoadResult] = []
    avail = objective.availability if objective is not None else None
    for i, level, conc in each_level(sweep, mode, label=f"load {url}", clients="clients",
                                     as_json=as_json):
        marks = trace_at is None or level == trace_at
        plan = LoadPlan(engine=engine_config(target, reqs, mode,
                                             kw if marks else {**kw, "trace_sample": 0.0},
                                             warm, conc),
                        rate=level if mode == "open" else None, arrival=arrival,  # type: ignore[arg-type]
                        duration_s=dur, requests=n_requests, seed=kw["seed"] + i,
                        processes=processes, cold_start=not no_cold_start)
        thr = objective.latency[0].threshold_s if objective and objective.latency else None
        if meter is not None:
            meter.start()
        reader = start_reader(url, enabled=server_side[0], pid=server_side[1],
                              prometheus_url=server_side[2])
        try:
            r = run_load(plan, slo_threshold_s=thr, cluster=cluster)
        except BaseException:
            if reader is not None:
                reader.halt()
            raise
        finally:
            server = meter.stop() if meter is not None else {}
        side = level_signals(reader, r)
        check_ran(r, url)
        results.append(r)
        lines = None
        if objective is not None:
            lines = budget(objective, hist=LatencyHistogram.decode(r.hist_blob),
                           successes=r.successes, failures=r.failures, wall_s=r.wall_s,
                           period_s=period_s)
        out.append({**_level_json(r, lines, avail), "server": server or None,
                    "server_signals": side.model_dump() if side is not None else None})
        if records is not None:
            # One level at a time: what was measured stays even if a later level is cut short.
            rec = to_record(r, experiment=exp, url=url, budget=lines,
                            slo=objective.label if objective else None,
                            extra={"payload": kind, **server})
            append_records(records, [rec.model_copy(update={"server": side})])
    doc = {"url": url, "payload": kind, "experiment": exp, "mode": mode,
           "headers": header_names(target),
           "slo": objective.label if objective else None,
           "availability": DEFAULT_AVAILABILITY if avail is None else avail,
           "availability_given": avail is not None,
           "validity_rules": VALIDITY_RULES, "levels": out,
           "records": str(records) if records else None}
    emit(doc, as_json, lambda c: _render_levels(c, doc))
    exit_if_all_failed(list(results), url)
    exit_if_missed([f"{b.objective} at {level_of(lv):g}"
                    for lv in out for b in (lv["budget"] or []) if not b.met])


def _level_json(r: LoadResult, lines: list[Any] | None,
                availability: float | None = None) -> dict[str, Any]:
    d = {k: v for k, v in r.__dict__.items() if k not in ("hist_blob", "steady", "slice_blobs")}
    d["healthy"] = r.healthy(availability)
    d["budget"] = lines
    return d


def _render_levels(c: Console, doc: dict[str, Any]) -> None:
    t = Table(title=f"load {doc['url']} ({doc['mode']} loop, {doc['payload']}; latency ms)",
              box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    for col in ("level", "sent/s", "ok/s", "good/s", "p50", "p95", "p99", "p99.9", "max",
                "failures", "lag p50/p99/max", "valid", "healthy"):
        t.add_column(col, justify="right")
    for lv in doc["levels"]:
        lat = lv["latency"]
        level = level_of(lv)
        t.add_row(f"{level:g}", f"{lv['sent_rps']:.0f}", f"{lv['throughput_rps']:.0f}",
                  f"{lv['goodput_rps']:.0f}", _ms(lat.p50_ms), _ms(lat.p95_ms),
                  _ms(lat.p99_ms), _ms(lat.p999_ms), _ms(lat.max_ms), failures_cell(lv),
                  "/".join(_ms(lv[k]) for k in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms")),
                  "yes" if lv["valid"] else "NO", "yes" if lv["healthy"] else "NO")
    # cut at 80 columns when stdout is not a terminal: print at the width it needs
    (c if c.width >= 130 else Console(width=130, highlight=False, file=c.file)).print(t)
    c.print(f"[dim]valid: the generator offered the load asked for; healthy: at least "
            f"{doc['availability']:.3g} of the server's answers succeeded"
            + ("" if doc["availability_given"] else " (the default availability objective)")
            + "[/]")
    _render_connections(c, doc["levels"])
    traced = sum(lv["traced_requests"] for lv in doc["levels"])
    if traced:
        c.print(f"traced: {traced} requests carried a sampled traceparent (ids in --json)")
    for lv in doc["levels"]:
        if lv["cold_start_ms"] is not None:
            c.print(f"cold start (first request, fresh connection): {lv['cold_start_ms']:.1f} ms")
            break
    for lv in doc["levels"]:
        for reason in lv["invalid_reasons"]:
            c.print(f"[yellow]invalid:[/] {reason}")
    if doc["slo"]:
        _render_budget(c, [(level_of(lv), lv["budget"]) for lv in doc["levels"]], doc["slo"])
    if doc["records"]:
        c.print(f"records appended to {doc['records']}")


def _render_connections(c: Console, levels: list[dict[str, Any]]) -> None:
    """What the client saw of the server's connections: closes, resends, Retry-After."""
    closes = sum(lv.get("server_closes", 0) for lv in levels)
    retries = sum(lv.get("retries", 0) for lv in levels)
    if closes:
        c.print(f"the server closed {closes:,} connections (Connection: close, HTTP/1.0 or "
                "idle); each was replaced by a new one, counted in connections")
    if retries:
        c.print(f"{retries:,} requests hit a kept-alive connection the server had closed "
                "before answering and were sent once more on a fresh one")
    ra = [lv["retry_after_max_s"] for lv in levels if lv.get("retry_after_count")]
    if ra:
        n = sum(lv["retry_after_count"] for lv in levels)
        c.print(f"{n:,} refusals carried Retry-After (up to {max(ra):g} s): the server's "
                "admission limit speaking")


def _render_budget(c: Console, rows: list[tuple[Any, list[Any]]], label: str) -> None:
    t = Table(title=f"error budget: {label}", box=box.SIMPLE, pad_edge=False,
              collapse_padding=True)
    for col in ("level", "objective", "events", "bad", "bad%", "allowed%", "burn",
                "lasts", "met"):
        t.add_column(col, justify="right")
    for level, lines in rows:
        for b in lines:
            g = b if isinstance(b, dict) else b.__dict__
            lasts = g["exhausted_in_s"]
            t.add_row(f"{level:g}", g["objective"], str(g["events"]), str(g["bad"]),
                      f"{g['bad_fraction']:.3%}", f"{g['allowed_fraction']:.3%}",
                      f"{g['burn_rate']:.2f}", "-" if lasts is None else f"{lasts / 86400:.1f} d",
                      "yes" if g["met"] else "NO")
    c.print(t)


@app.command("capacity")
@click.argument("url")
@click.option("--slo", required=True, help='One latency objective, e.g. "p95<50ms".')
@click.option("--error-budget", help="Also require availability, e.g. 0.1%.")
@click.option("--start", type=float, default=10.0, show_default=True, help="First rate (req/s).")
@click.option("--max-rate", type=float, default=100_000.0, show_default=True)
@click.option("--min-rate", type=float, default=None,
              help="Never offer less: where --start fails the search halves down to it, and "
                   "failed confirmations send it no lower (default: --start / 64).")
@click.option("--fails-at", type=float, default=None,
              help="A rate already measured to miss the SLO (e.g. a `load run` level): the "
                   "search stays below it and bisects towards it.")
@click.option("--precision", default="5%", show_default=True,
              help="Stop when the pass/fail interval is this narrow (relative).")
@click.option("--confidence", default="95%", show_default=True,
              help="Confidence of each step's pass/fail decision.")
@click.option("--min-step", default="3s", show_default=True, help="Shortest step.")
@click.option("--max-step", default="60s", show_default=True, help="Longest step.")
@click.option("--min-requests", default="auto", show_default=True,
              help="Requests a step needs before it may decide; auto: sized by the quantile "
                   "(LoadGen's early-stopping test passing half the tail allowance).")
@click.option("--max-steps", type=int, default=20, show_default=True)
@click.option("--invalid-retries", type=int, default=1, show_default=True,
              help="Run a step the generator could not offer (invalid) again this many times.")
@click.option("--arrival", type=click.Choice(list(ARRIVALS)), default="poisson",
              show_default=True)
@click.option("--warmup", default="1s", show_default=True, help="Unmeasured warm-up per step.")
@click.option("--confirm", default=f"{CONFIRM_S:g}s", show_default=True,
              help="Confirm the answer by a run this long at its rate (never stopped early); a "
                   "failed confirmation sends the search below it until one holds (down to "
                   "--min-rate, while --max-steps last). 0 skips it (the answer is then "
                   "unconfirmed).")
@budget_option
@click.option("--records", type=click.Path(path_type=Path), help="Append one record per step.")
@click.option("--experiment", help="Experiment id for the records.")
@click.option("--plot", type=click.Path(path_type=Path),
              help="Write the latency-throughput curve (PNG or SVG).")
@cluster_option
@request_options
@output_option
@json_option
def capacity(url: str, slo: str, error_budget: str | None, start: float, max_rate: float,
             min_rate: float | None, fails_at: float | None, precision: str, confidence: str,
             min_step: str, max_step: str, min_requests: str, max_steps: int,
             invalid_retries: int, arrival: str, warmup: str, confirm: str, budget: str | None,
             records: Path | None, experiment: str | None, plot: Path | None,
             cluster_address: str | None, as_json: bool, **kw: Any) -> None:
    """Find the highest arrival rate meeting the SLO (exponential search, then bisection).

    \b
    Exit status: 0 a rate met the objectives (and held in its confirmation run); 1 no tried
    rate met them, or none held in a confirmation; 2 bad usage or input; 70 internal error;
    130 interrupted.
    """
    with open_cluster(cluster_address) as cluster:
        _capacity(url, slo, error_budget, start, max_rate, precision, confidence, min_step,
                  max_step, min_requests, max_steps, invalid_retries, arrival, warmup, records,
                  experiment, plot, as_json, kw, cluster, fails_at=fails_at, confirm=confirm,
                  min_rate=min_rate, budget=budget)


def _capacity(url: str, slo: str, error_budget: str | None, start: float, max_rate: float,
              precision: str, confidence: str, min_step: str, max_step: str, min_requests: str,
              max_steps: int, invalid_retries: int, arrival: str, warmup: str,
              records: Path | None, experiment: str | None, plot: Path | None, as_json: bool,
              kw: dict[str, Any], cluster: Cluster | None, *,
              fails_at: float | None = None, confirm: str = f"{CONFIRM_S:g}s",
              min_rate: float | None = None, budget: str | None = None) -> None:
    objective = parse_slo(slo, error_budget=error_budget)
    conf = fraction(confidence, what="--confidence")
    rule = StepRule(slo=objective, confidence=conf,
                    min_step_s=parse_duration(min_step, what="--min-step"),
                    max_step_s=parse_duration(max_step, what="--max-step"),
                    min_requests=None if min_requests == "auto" else
                    _int(min_requests, what="--min-requests"))
    needed = rule.requests_needed
    cfg = SearchConfig(start=start, max_rate=max_rate,
                       precision=parse_percent(precision, what="--precision"),
                       max_steps=max_steps, invalid_retries=invalid_retries,
                       fails_at=fails_at, min_rate=min_rate)
    target, reqs, kind = build_requests(url, kw)
    warm = parse_duration(warmup, what="--warmup")
    confirm_s = parse_duration(confirm, what="--confirm")
    exp = experiment or new_experiment_id("capacity")
    obj = objective.latency[0]
    tried: list[LoadResult] = []

    def on_step(rate: float, confirmation: bool) -> None:
        what = "confirmation" if confirmation else "capacity step"
        progress.advance(f"{what}: {rate:.1f} req/s")
        if not as_json and not progress_shown():
            err_console.print(f"[dim]{what}: {rate:.1f} req/s ...[/]")

    def ran(r: LoadResult) -> None:
        check_ran(r, url)
        tried.append(r)

    runner = HttpSearch(engine=engine_config(target, reqs, "open", kw, warm), rule=rule,
                        arrival=arrival, seed=kw["seed"], confirm_s=confirm_s,  # type: ignore[arg-type]
                        cluster=cluster, experiment=exp, url=url, extra={"payload": kind},
                        on_step=on_step, check=ran)
    with live_progress("capacity", total=max_steps) as progress:
        res = runner.run(cfg, deadline=deadline(budget, step_s=rule.max_step_s,
                                                 confirm_s=confirm_s, warmup_s=warm))
    if records is not None:
        append_records(records, runner.records)
    if plot is not None:
        _plot_curve(res, obj.label, plot)
    doc = {"url": url, "slo": objective.label, "confidence": conf, "experiment": exp,
           "step_requests": needed,
           "step_rule": "auto" if min_requests == "auto" else "given",
           "capacity_rps": res.capacity_rps, "interval_rps": list(res.interval_rps),
           "confirmed_rps": res.confirmed_rps, "confirm_s": confirm_s,
           "confirm_stopped": res.stopped, "min_rate": cfg.floor, "budget": budget,
           **availability_doc(objective.availability),
           "generator_limit_rps": res.generator_limit_rps, "answer": res.answer(),
           "fails_at": fails_at,
           "converged": res.converged, "knee_rps": res.knee_rps,
           "steps": [s.__dict__ for s in res.steps],
           "records": str(records) if records else None, "plot": str(plot) if plot else None}
    emit(doc, as_json, lambda c: _render_capacity(c, res, doc))
    if res.capacity_rps is None and not res.confirmations:
        exit_if_all_failed(tried, url)  # every step's every request failed: the cause
        exit_if_missed([f"{objective.label} at every rate tried"])
    if confirm_s > 0 and res.confirmed_rps is None:
        exit_if_missed([unconfirmed(objective.label, res)])


def _int(text: str, *, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadUsageError(f"{what}: {text!r} is not a whole number (or 'auto')") from None


def _render_capacity(c: Console, res: CapacityResult, doc: dict[str, Any]) -> None:
    t = Table(title=f"capacity search {doc['url']} for {doc['slo']}", box=box.SIMPLE,
              pad_edge=False, collapse_padding=True)
    for col in ("step", "rate", "verdict", "requests", "ok/s", "q ms", "CI ms", "errors",
                "steady", "valid"):
        t.add_column(col, justify="right")
    for i, s in enumerate(res.steps):
        lo, hi = s.quantile_ci_ms
        steady = "-" if s.steady is None else "yes" if s.steady.steady else "NO"
        t.add_row(f"{i + 1}{' (confirm)' if s.confirmation else ''}", f"{s.rate:.1f}",
                  s.verdict, str(s.requests), f"{s.throughput_rps:.1f}", _ms(s.quantile_ms),
                  f"[{_ms(lo)}, {_ms(hi)}]", f"{s.error_rate:.2%}", steady,
                  "yes" if s.valid else "NO")
    c.print(t)
    c.print(availability_line(doc))
    c.print(f"each step decides only after {doc['step_requests']:,} requests"
            + (" (sized for the quantile: LoadGen's early-stopping test passing a server that "
               "uses half its tail allowance)" if doc["step_rule"] == "auto" else ""))
    for i, s in enumerate(res.steps):
        reasons = s.extras.get("invalid_reasons")
        for reason in reasons if isinstance(reasons, list) else []:
            c.print(f"[yellow]step {i + 1} invalid:[/] {reason}")
        why = s.extras.get("why")
        for reason in why if isinstance(why, list) else []:
            c.print(f"[yellow]step {i + 1} failed:[/] {reason}")
    lo, hi = res.interval_rps
    if res.capacity_rps is None:
        c.print(res.answer() if res.confirmations else
                f"no tried rate met {doc['slo']} (lowest failing: {_ms(hi)} req/s)")
    else:
        c.print(f"{res.answer()}; interval [{_ms(lo)}, {_ms(hi)}] req/s at "
                f"{doc['confidence']:.0%} per step"
                + ("" if res.converged or res.at_least else " (not converged: raise --max-steps)"))
    if res.knee_rps is not None:
        c.print(f"knee of the latency-throughput curve: {res.knee_rps:.1f} req/s")


def _plot_curve(res: CapacityResult, label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted((s.throughput_rps, s.quantile_ms or 0.0, s.passed) for s in res.steps)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color="grey")
    for x, y, ok in pts:
        ax.plot(x, y, "o", color="tab:green" if ok else "tab:red")
    if res.knee_rps is not None:
        ax.axvline(res.knee_rps, ls="--", color="tab:blue", label="knee")
        ax.legend()
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel(f"{label.split('<')[0]} latency (ms)")
    ax.set_title(f"latency vs throughput ({label})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


@app.command("budget")
@click.option("--slo", required=True, help='Objectives, e.g. "p95<50ms,avail>=99.9%".')
@click.option("--error-budget", help="Availability budget, e.g. 0.1%.")
@click.option("--records", type=click.Path(path_type=Path), required=True,
              help="Records file written by `scalelab load` or `load capacity`.")
@click.option("--experiment", help="Only this experiment's records.")
@click.option("--period", default="30d", show_default=True, help="SLO period.")
@json_option
def budget_cmd(slo: str, error_budget: str | None, records: Path, experiment: str | None,
               period: str, as_json: bool) -> None:
    """Error budget and burn rate per load level from a records file."""
    objective: Slo = parse_slo(slo, error_budget=error_budget)
    period_s = parse_duration(period, what="--period")
    rows: list[dict[str, Any]] = []
    for rec in read_records(records):
        if not rec.stage.startswith("load") or (experiment and rec.experiment != experiment):
            continue
        blob = rec.histograms.get(LATENCY_HISTOGRAM)
        if blob is None:
            raise BadInputError(f"{records}: a load record of {rec.experiment} has no latency "
                                "histogram; re-run `scalelab load` to write one")
        succ = int(rec.extras.get("successes", 0))
        lines = budget(objective, hist=LatencyHistogram.decode(blob), successes=succ,
                       failures=rec.failures, wall_s=rec.wall_s or 0.0, period_s=period_s)
        rows.append({"experiment": rec.experiment, "variable": rec.variable,
                     "level": rec.level, "repeat": rec.repeat, "budget": lines})
    if not rows:
        raise BadInputError(f"{records}: no load records"
                            + (f" for experiment {experiment}" if experiment else ""))
    doc = {"slo": objective.label, "period_s": period_s, "levels": rows}
    emit(doc, as_json, lambda c: _render_budget(c, [(r["level"], r["budget"]) for r in rows],
                                                 objective.label))


from scalelab.cli.load_llm import llm as _llm  # noqa: E402  (#18: `load llm`, streaming LLM load)

app.add_command(_llm)
