"""`scalelab load llm URL` (streaming levels) and `load llm capacity URL` (token-SLO capacity).

URL is the server's base (http://host:port) or the full endpoint path; the path of the chosen
--api is used when the URL has none.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
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
from scalelab.cli._dataset import dataset_of, dataset_options, tokenizer_of
from scalelab.cli._export import levels_plot_option, output_option
from scalelab.cli._gate import exit_if_missed
from scalelab.cli._load_requests import (
    connection_options,
    exit_if_all_failed,
    failures_cell,
    header_names,
    target_of,
)
from scalelab.cli._output import DefaultGroup, emit, err_console, json_option, plot_option
from scalelab.cli._prices import prices_option, resolve_prices
from scalelab.cli._progress import live_progress
from scalelab.cli._progress import shown as progress_shown
from scalelab.cli._sweep import (
    each_level,
    fraction,
    lengths,
    level_of,
    level_options,
    levels,
    trace_sample_option,
)
from scalelab.cli._sweep import fmt_ms as _ms
from scalelab.cli.load_sessions import sessions_cmd
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.machine import available_cores
from scalelab.lab.core.objectives import parse_percent
from scalelab.lab.core.records import append_records, new_experiment_id
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.capacity import CONFIRM_S, SearchConfig
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.llm.quality import Agreement, agreement
from scalelab.lab.load.llm.result import LAG_INVALID_SHARE, LlmResult, cost_of, summary, to_record
from scalelab.lab.load.llm.run import (
    EveryRequestFailed,
    LlmPlan,
    capacity,
    check_ran,
    reference_answers,
    run_llm,
)
from scalelab.lab.load.llm.stream import ProbeAnswer, StreamConfig
from scalelab.lab.load.llm.token_slo import TokenSlo, TokenStepRule, parse_token_slo
from scalelab.lab.load.llm.workload import APIS, PATHS, USAGE_MODES, LengthDist, Workload
from scalelab.lab.load.result import DEFAULT_AVAILABILITY
from scalelab.lab.load.schedule import ARRIVALS, Mode
from scalelab.lab.load.scrape import Sampler, note_limits
from scalelab.lab.load.send import Target, served_model
from scalelab.lab.load.server.reader import level_signals, start_reader


@click.group("llm", cls=DefaultGroup)
def llm() -> None:
    """Streaming load tests of an OpenAI-compatible endpoint: TTFT, ITL, TPOT, tokens/s."""


def _workload_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--api", type=click.Choice(list(APIS)), default="chat", show_default=True,
                     help="/v1/chat/completions or /v1/completions."),
        click.option("--model", "model_name",
                     help="The request's model field (default: the first of GET /v1/models)."),
        click.option("--prompt-tokens", default="fixed:128", show_default=True,
                     help="Prompt length in words, not tokens (words of a common-English "
                          "vocabulary, about one token each in GPT-2/Llama/SmolLM tokenizers; "
                          "the server's usage in the results is the true count): fixed:N, "
                          "uniform:A,B, normal:M,SD."),
        click.option("--output-tokens", default="fixed:64", show_default=True,
                     help="max_tokens per request, same forms."),
        click.option("--prompts", type=click.Path(path_type=Path),
                     help="Sample prompts from this file (JSON Lines or one per line)."),
        click.option("--shared-prefix", type=int, default=0, show_default=True,
                     help="Words of a system prompt shared by every request."),
        click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
                     help="Ask the server to run every answer to max_tokens (vLLM field)."),
        click.option("--usage", type=click.Choice(list(USAGE_MODES)), default="continuous",
                     show_default=True,
                     help="Token counts per chunk: continuous (exact), final (OpenAI), none."),
        click.option("--distinct", type=int, default=256, show_default=True,
                     help="Distinct requests built (used round-robin)."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the workload and of Poisson arrivals."),
        click.option("--temperature", type=float, default=0.0, show_default=True,
                     help="Sampling temperature of every request (0: greedy)."),
        click.option("--timeout", default="60s", show_default=True,
                     help="A stream unfinished this long after its due time is a timeout."),
        click.option("--max-connections", type=int, default=1024, show_default=True,
                     help="Most streams at once per process."),
        trace_sample_option,
        prices_option,
        click.option("--core-hour-usd", type=float,
                     help="Overrides the price table's core_hour_usd (--prices), for cost "
                          "per 1k tokens."),
        click.option("--cores", type=int, help="Cores the server uses (default: this machine's)."),
        click.option("--gpu-hour-usd", type=float,
                     help="Overrides the price table's gpu_hour_usd (--prices)."),
        click.option("--gpus", type=int, default=0, show_default=True,
                     help="GPUs the server uses."),
        click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True,
                     help="Send 'Authorization: Bearer KEY' with every request, GET "
                          "/v1/models included (default: $OPENAI_API_KEY). Never written "
                          "to records, reports or logs."),
    ]
    return connection_options(functools.reduce(lambda acc, o: o(acc), reversed(opts),
                                               dataset_options(f)))


def _workload(url: str, kw: dict[str, Any]) -> tuple[Target, Workload, list[bytes]]:
    model = kw["model_name"]
    base = target_of(url, kw)
    if model is None:
        model = served_model(base) or "default"
    wl = Workload(api=kw["api"], model=model,
                  prompt=LengthDist.parse(kw["prompt_tokens"], what="--prompt-tokens"),
                  output=LengthDist.parse(kw["output_tokens"], what="--output-tokens"),
                  prompts_file=kw.get("prompts"), shared_prefix_words=kw["shared_prefix"],
                  ignore_eos=kw["ignore_eos"], usage=kw["usage"], seed=kw["seed"],
                  distinct=kw["distinct"], temperature=kw["temperature"],
                  dataset=dataset_of(kw))
    target = base
    if target.path in ("", "/"):
        target = dataclasses.replace(target, path=PATHS[wl.api])
    elif target.path.rstrip("/") != wl.path:
        raise BadUsageError(f"URL path {target.path!r} does not match --api {wl.api} "
                            f"({wl.path}); give the server's base URL or the matching path")
    return target, wl, wl.build(target)


def price_per_hour(kw: dict[str, Any]) -> float:
    """The server's hourly price from the one price table: cores × core-hour + GPUs × GPU-hour."""
    cores = kw.get("cores") or available_cores()
    if cores < 1 or kw["gpus"] < 0:
        raise BadUsageError("--cores must be >= 1 and --gpus >= 0")
    table = resolve_prices(kw.get("prices_file"), core_hour_usd=kw.get("core_hour_usd"),
                           gpu_hour_usd=kw.get("gpu_hour_usd"))
    return table.hourly_usd(cores, kw["gpus"])


def _stream(target: Target, reqs: list[bytes], mode: Mode, kw: dict[str, Any], warm: float,
            concurrency: int = 1, probe: list[bytes] | None = None) -> StreamConfig:
    return StreamConfig(target=target, requests=reqs, mode=mode, concurrency=concurrency,
                        warmup_s=warm, timeout_s=parse_duration(kw["timeout"], what="--timeout"),
                        max_connections=kw["max_connections"],
                        trace_sample=float(kw.get("trace_sample") or 0.0),
                        trace_seed=int(kw.get("seed") or 0), probe_requests=probe or [],
                        tokenizer=tokenizer_of(kw))


@llm.command("run")
@click.argument("url")
@level_options(rate_help="Open loop: requests per second.",
               concurrency_help="Closed loop: streams at once (a comma list sweeps).",
               loop_default="open", loop_help="With --base: sweep rates (open) or "
               "concurrency (closed).", multiples_help="With --base: the multiples.",
               processes_help="Generator processes.")
@click.option("--slo", help='Token objectives, e.g. "ttft_p95<500ms,tpot_p95<60ms,avail>=99.9%".')
@click.option("--records", type=click.Path(path_type=Path), help="Append one record per level.")
@click.option("--experiment", help="Experiment id for the records (default: generated).")
@click.option("--metrics-url", help="Sample the server's Prometheus metrics (vLLM names: "
              "running/waiting sequences, KV usage, preemptions) during each level.")
@click.option("--series", help="Tag the records with this series name (e.g. an engine setting).")
@click.option("--server-pid", type=int, help="Sample this local server process tree's CPU "
              "(cpu_busy_cores) and peak memory during each level.")
@click.option("--server-signals", is_flag=True,
              help="Read the server's side of each level into its record: its /metrics "
                   "(process_* metrics; vLLM, SGLang, TGI, llama.cpp, Triton, Ray Serve names), "
                   "llama-server's /slots and, for a local server, its process tree "
                   "(--server-pid, or found from the port).")
@click.option("--prometheus", metavar="URL",
              help="A Prometheus server to ask for the node_exporter, cAdvisor and DCGM series "
                   "of each level's window (implies --server-signals).")
@click.option("--quality-probe", "quality_probe", type=int, default=0, show_default=True,
              help="Output quality: answer the first N workload prompts one at a time first, "
                   "then send them as each level's first requests and report greedy agreement "
                   "with those answers (0: off).")
@cluster_option
@_workload_options
@levels_plot_option("ttft")
@output_option
@json_option
def run(url: str, rate: float | None, rates: str | None, concurrency: str | None,
        base: float | None, loop: str, multiples: str, arrival: str, duration: str | None,
        n_requests: int | None, warmup: str, processes: int, slo: str | None,
        records: Path | None, experiment: str | None, metrics_url: str | None,
        series: str | None, server_pid: int | None, server_signals: bool,
        prometheus: str | None, quality_probe: int,
        cluster_address: str | None, as_json: bool, **kw: Any) -> None:
    """Stream chat/completion requests at each level; TTFT, ITL, TPOT, tokens/s, goodput,
    and with --quality-probe the greedy agreement with one-at-a-time answers.

    \b
    Exit status: 0 done, every given objective met; 1 an objective was missed (printed on
    stderr after the output); 2 bad usage or input; 70 internal error; 130 interrupted.
    """
    arrival, rate, duration = resolve_arrival(kw, arrival=arrival, rate=rate, rates=rates,
                                              concurrency=concurrency, duration=duration,
                                              n_requests=n_requests, warmup=warmup)
    with open_cluster(cluster_address) as cluster:
        _run(url, rate, rates, concurrency, base, loop, multiples, arrival, duration,
             n_requests, warmup, processes, slo, records, experiment, metrics_url, series,
             server_pid, quality_probe, as_json, kw, cluster,
             server_side=(server_signals, prometheus))


def _run(url: str, rate: float | None, rates: str | None, concurrency: str | None,
         base: float | None, loop: str, multiples: str, arrival: str, duration: str | None,
         n_requests: int | None, warmup: str, processes: int, slo: str | None,
         records: Path | None, experiment: str | None, metrics_url: str | None,
         series: str | None, server_pid: int | None, quality_probe: int, as_json: bool,
         kw: dict[str, Any], cluster: Cluster | None,
         server_side: tuple[bool, str | None] = (False, None)) -> None:
    mode, sweep = levels(rate, rates, concurrency, base, loop, multiples,
                         examples="--rates 1,2,5, --concurrency 1,4,16")
    dur, warm = lengths(duration, n_requests, warmup)
    objective = parse_token_slo(slo) if slo else None
    price = price_per_hour(kw)
    target, wl, reqs = _workload(url, kw)
    if not 0 <= quality_probe <= len(reqs):
        raise BadUsageError(f"--quality-probe must lie in [0, --distinct={len(reqs)}], got "
                            f"{quality_probe}")
    probe = reqs[:quality_probe]
    exp = experiment or new_experiment_id("llm")
    reference: list[ProbeAnswer] = []
    if probe and wl.temperature == 0:
        if not as_json:
            err_console.print(f"[dim]quality probe: {len(probe)} prompts one at a time ...[/]")
        reference = reference_answers(_stream(target, reqs, "closed", kw, 0.0, 1, probe))
    out: list[dict[str, Any]] = []
    results: list[LlmResult] = []
    avail = objective.availability if objective is not None else None
    for i, level, conc in each_level(sweep, mode, label=f"load llm {target.base}{target.path}",
                                     clients="streams", as_json=as_json):
        plan = LlmPlan(stream=_stream(target, reqs, mode, kw, warm, conc, probe),
                       rate=level if mode == "open" else None, arrival=arrival,  # type: ignore[arg-type]
                       duration_s=dur, requests=n_requests, seed=kw["seed"] + i,
                       processes=processes)
        engine: dict[str, Any] = {}
        reader = start_reader(target.base, enabled=server_side[0], pid=server_pid,
                              prometheus_url=server_side[1])
        if metrics_url or server_pid:
            with Sampler(metrics_url, pid=server_pid) as sampler:
                r = run_llm(plan, cluster=cluster)
            engine = sampler.extras()
        else:
            r = run_llm(plan, cluster=cluster)
        side = level_signals(reader, r)
        check_ran(r, url)
        results.append(r)
        agree = agreement(reference, r.probe, temperature=wl.temperature) if probe else None
        out.append({**level_json(r, objective, price), "healthy": r.healthy(avail),
                    "engine": engine,
                    "server_signals": side.model_dump() if side is not None else None,
                    "quality": quality_json(agree)})
        if records is not None:
            extra: dict[str, Any] = {**engine, "model": wl.model,
                                     **({"series": series} if series else {}),
                                     **(agree.extras() if agree else {})}
            limit = note_limits(extra)
            rss = engine.get("server_peak_rss_bytes")
            rec = to_record(r, experiment=exp, url=url, workload=wl.label(),
                            slo=objective, price_per_hour_usd=price,
                            extra=extra, limiting_resource=limit,
                            peak_memory_bytes=int(rss) if rss else None,
                            quality=agree.quality() if agree else None)
            append_records(records, [rec.model_copy(update={"server": side})])
    doc = {"url": f"{target.base}{target.path}", "workload": wl.label(), "experiment": exp,
           "headers": header_names(target), "mode": mode,
           "slo": objective.label if objective else None,
           "availability": DEFAULT_AVAILABILITY if avail is None else avail,
           "availability_given": avail is not None,
           "price_per_hour_usd": price, "lag_invalid_share": LAG_INVALID_SHARE, "levels": out,
           "records": str(records) if records else None}
    emit(doc, as_json, lambda c: render_levels(c, doc))
    exit_if_all_failed(list(results), url, llm=True)
    exit_if_missed([f"{x['objective']} at {level_of(lv):g}"
                    for lv in out for x in lv.get("objectives", []) if not x["met"]])


def quality_json(a: Agreement | None) -> dict[str, Any] | None:
    """A level's greedy agreement for the JSON document (None: no probe was asked for)."""
    if a is None:
        return None
    return {"identical_share": a.identical_share, "prefix_agreement": a.prefix_agreement,
            "compared": a.compared, "failed": a.failed, "prompts": a.prompts, "basis": a.basis,
            "not_measured": a.not_measured}


def level_json(r: LlmResult, slo: TokenSlo | None, price: float) -> dict[str, Any]:
    """One level for the JSON document: summary, objectives, goodput and cost."""
    d = summary(r)
    d["cost"] = {"price_per_hour_usd": price,
                 "per_1k_output_tokens_usd": cost_of(price, r.output_tps),
                 "per_1k_total_tokens_usd": cost_of(price, r.total_tps)}
    if slo is not None:
        lines, good = r.judge(slo)
        d["objectives"] = [x.__dict__ for x in lines]
        d["slo_met"] = all(x.met for x in lines)
        d["goodput"] = good.__dict__
        d["cost"]["per_1k_good_output_tokens_usd"] = cost_of(price, good.goodput_tps)
    return d


def _wide(c: Console, width: int) -> Console:
    """Tables this wide are cut at 80 columns when stdout is not a terminal (pipes, docs):
    print them on a console of the width they need, to the same file."""
    if c.width >= width:
        return c
    return Console(width=width, highlight=False, file=c.file)


def render_levels(c: Console, doc: dict[str, Any]) -> None:
    t = Table(title=f"load llm {doc['url']} ({doc['mode']} loop; {doc['workload']}; ms)",
              box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    cols = ["level", "ok/s", "tok/s", "TTFT p50", "p99", "ITL p50", "p99", "TPOT p50", "p99",
            "e2e p99", "failures", "lag p99", "$/1k tok", "valid", "healthy"]
    if doc["slo"]:
        cols += ["good/s", "SLO"]
    probed = any(lv.get("quality") for lv in doc["levels"])
    if probed:
        cols += ["same", "agree"]
    for col in cols:
        t.add_column(col, justify="right")
    for lv in doc["levels"]:
        level = level_of(lv)
        errs = failures_cell(lv)
        c1k = lv["cost"]["per_1k_output_tokens_usd"]
        row = [f"{level:g}", f"{lv['throughput_rps']:.1f}", f"{lv['output_tps']:.0f}",
               _ms(lv["ttft"]["p50_ms"]), _ms(lv["ttft"]["p99_ms"]), _ms(lv["itl"]["p50_ms"]),
               _ms(lv["itl"]["p99_ms"]), _ms(lv["tpot"]["p50_ms"]), _ms(lv["tpot"]["p99_ms"]),
               _ms(lv["e2e"]["p99_ms"]), errs, _ms(lv["lag"]["p99_ms"]),
               "-" if c1k is None else f"{c1k:.5f}", "yes" if lv["valid"] else "NO",
               "yes" if lv.get("healthy", True) else "NO"]
        if doc["slo"]:
            row += [f"{lv['goodput']['goodput_rps']:.1f}", "met" if lv["slo_met"] else "MISSED"]
        if probed:
            q = lv.get("quality") or {}
            ident, pre = q.get("identical_share"), q.get("prefix_agreement")
            row += ["-" if ident is None else f"{ident:.2f}", "-" if pre is None else f"{pre:.3f}"]
        t.add_row(*row)
    _wide(c, 150).print(t)
    if "availability" in doc:
        c.print(f"[dim]valid: the generator offered the load asked for; healthy: at least "
                f"{doc['availability']:.3g} of the server's answers succeeded"
                + ("" if doc["availability_given"] else " (the default availability objective)")
                + "[/]")
    sources = {k: sum(lv["token_sources"].get(k, 0) for lv in doc["levels"])
               for k in ("usage-continuous", "usage-final", "chunks")}
    said = [f"{k} ({n})" for k, n in sources.items() if n]
    if said:
        c.print(f"[dim]tokens counted from: {', '.join(said)}[/]")
    if probed:
        q0 = next(lv["quality"] for lv in doc["levels"] if lv.get("quality"))
        c.print(f"[dim]same / agree: greedy agreement with the same {q0['prompts']} prompts "
                "answered one at a time (share identical / mean share of tokens before the "
                f"first divergence; {q0['basis']})[/]")
    for lv in doc["levels"]:
        q = lv.get("quality") or {}
        if q.get("not_measured"):
            c.print(f"[yellow]quality not measured:[/] {q['not_measured']}")
        for reason in lv["invalid_reasons"]:
            c.print(f"[yellow]invalid:[/] {reason}")
        for note in lv["notes"]:
            c.print(f"[dim]note:[/] {note}")
    if doc["records"]:
        c.print(f"records appended to {doc['records']}")


@llm.command("capacity")
@click.argument("url")
@click.option("--slo", required=True,
              help='Token objectives, e.g. "ttft_p95<500ms,tpot_p95<60ms,avail>=99.9%" '
                   '(availability 99% where none is given: a step whose failures decide it '
                   'missed never passes).')
@click.option("--start", type=float, default=1.0, show_default=True, help="First rate (req/s).")
@click.option("--max-rate", type=float, default=10_000.0, show_default=True)
@click.option("--min-rate", type=float, default=None,
              help="Never offer less: where --start fails the search halves down to it, and "
                   "failed confirmations send it no lower (default: --start / 64).")
@click.option("--precision", default="10%", show_default=True,
              help="Stop when the pass/fail interval is this narrow (relative).")
@click.option("--confidence", default="95%", show_default=True)
@click.option("--min-step", default="3s", show_default=True, help="Shortest step.")
@click.option("--max-step", default="20s", show_default=True, help="Longest step.")
@click.option("--max-steps", type=int, default=12, show_default=True)
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
@plot_option("TTFT and TPOT quantiles against the tried rates, and the capacity found")
@cluster_option
@_workload_options
@output_option
@json_option
def capacity_cmd(url: str, slo: str, start: float, max_rate: float, min_rate: float | None,
                 precision: str,
                 confidence: str, min_step: str, max_step: str, max_steps: int, arrival: str,
                 warmup: str, confirm: str, budget: str | None, records: Path | None,
                 experiment: str | None,
                 plot: Path | None, cluster_address: str | None, as_json: bool,
                 **kw: Any) -> None:
    """The highest arrival rate meeting every token objective, in req/s and output tokens/s.

    \b
    Exit status: 0 a rate met the objectives (and held in its confirmation run); 1 no tried
    rate met them, or none held in a confirmation; 2 bad usage or input; 70 internal error;
    130 interrupted.
    """
    with open_cluster(cluster_address) as cluster:
        _capacity(url, slo, start, max_rate, precision, confidence, min_step, max_step,
                  max_steps, arrival, warmup, records, experiment, plot, as_json, kw, cluster,
                  confirm=confirm, min_rate=min_rate, budget=budget)


def _capacity(url: str, slo: str, start: float, max_rate: float, precision: str,
              confidence: str, min_step: str, max_step: str, max_steps: int, arrival: str,
              warmup: str, records: Path | None, experiment: str | None, plot: Path | None,
              as_json: bool, kw: dict[str, Any], cluster: Cluster | None, *,
              confirm: str = f"{CONFIRM_S:g}s", min_rate: float | None = None,
              budget: str | None = None) -> None:
    objective = parse_token_slo(slo)
    conf = fraction(confidence, what="--confidence")
    rule = TokenStepRule(slo=objective, confidence=conf,
                         min_step_s=parse_duration(min_step, what="--min-step"),
                         max_step_s=parse_duration(max_step, what="--max-step"))
    cfg = SearchConfig(start=start, max_rate=max_rate,
                       precision=parse_percent(precision, what="--precision"),
                       max_steps=max_steps, min_rate=min_rate)
    price = price_per_hour(kw)
    target, wl, reqs = _workload(url, kw)
    warm = parse_duration(warmup, what="--warmup")
    exp = experiment or new_experiment_id("llm-capacity")
    confirm_s = parse_duration(confirm, what="--confirm")

    def make_plan(rate: float, i: int) -> LlmPlan:
        return LlmPlan(stream=_stream(target, reqs, "open", kw, warm), rate=rate,
                       arrival=arrival, duration_s=rule.max_step_s,  # type: ignore[arg-type]
                       seed=kw["seed"] + i)

    with live_progress("capacity", total=max_steps) as progress:

        def on_step(rate: float, confirmation: bool) -> None:
            what = "confirmation" if confirmation else "capacity step"
            progress.advance(f"{what}: {rate:.2f} req/s")
            if not as_json and not progress_shown():
                err_console.print(f"[dim]{what}: {rate:.2f} req/s ...[/]")

        try:
            res = capacity(make_plan, rule, cfg, on_step=on_step, url=url, cluster=cluster,
                           confirm_s=confirm_s,
                           deadline=deadline(budget, step_s=rule.max_step_s,
                                             confirm_s=confirm_s, warmup_s=warm))
        except EveryRequestFailed as e:
            err_console.print(str(e), markup=False, highlight=False, soft_wrap=True)
            raise click.exceptions.Exit(1) from None
    if records is not None:
        append_records(records, res.records(experiment=exp, url=url, workload=wl.label(),
                                            slo=objective, price_per_hour_usd=price))
    steps = []
    for s, r in zip(res.result.steps, res.levels, strict=True):
        lv = level_json(r, objective, price)
        steps.append({"rate": s.rate, "verdict": s.verdict, "confirmation": s.confirmation,
                      "requests": s.requests,
                      "throughput_rps": s.throughput_rps, "output_tps": r.output_tps,
                      "ttft": lv["ttft"], "tpot": lv["tpot"], "itl": lv["itl"],
                      "error_rate": s.error_rate, "valid": s.valid, "wall_s": s.wall_s,
                      "objectives": lv["objectives"], "goodput": lv["goodput"]})
    lo, hi = res.result.interval_rps
    doc = {"url": f"{target.base}{target.path}", "workload": wl.label(), "slo": objective.label,
           "confidence": conf, "experiment": exp, "capacity_rps": res.result.capacity_rps,
           "confirmed_rps": res.result.confirmed_rps, "confirm_s": confirm_s,
           "confirm_stopped": res.result.stopped, "min_rate": cfg.floor, "budget": budget,
           **availability_doc(objective.availability),
           "answer": res.result.answer(),
           "interval_rps": [lo, hi], "capacity_output_tps": res.capacity_tps,
           "capacity_goodput_tps": res.capacity_goodput_tps,
           "converged": res.result.converged, "price_per_hour_usd": price,
           "cost_per_1k_output_tokens_usd": None if res.capacity_tps is None else
           cost_of(price, res.capacity_tps),
           "steps": steps, "records": str(records) if records else None,
           "plot": str(plot) if plot else None}
    if plot is not None:
        plot_capacity(doc, plot)
    emit(doc, as_json, lambda c: _render_capacity(c, doc))
    if doc["capacity_rps"] is None and not res.result.confirmations:
        exit_if_missed([f"{objective.label} at every rate tried"])
    if confirm_s > 0 and res.result.confirmed_rps is None:
        exit_if_missed([unconfirmed(objective.label, res.result)])


def plot_capacity(doc: dict[str, Any], path: Path) -> None:
    """The steps of `doc` (capacity's JSON) in rate order: the report's latency figure."""
    from scalelab.lab.report import figures

    steps = sorted(doc["steps"], key=lambda s: s["rate"])
    x = [s["rate"] for s in steps]
    curves = [figures.LatencyCurve(
        name=metric.upper(), x=x,
        quantiles={q: [s[metric][f"{q}_ms"] for s in steps] for q in ("p50", "p95", "p99")},
        passed=[s["verdict"].endswith("pass") for s in steps]) for metric in ("ttft", "tpot")]
    cap = doc["capacity_rps"]
    figures.save(figures.latency_figure(
        curves, variable="arrival rate (req/s)", title=f"capacity for {doc['slo']}",
        marker_x=cap, marker_label="" if cap is None else f"capacity {cap:.2f} req/s"), path)


def _render_capacity(c: Console, doc: dict[str, Any]) -> None:
    t = Table(title=f"capacity {doc['url']} for {doc['slo']}", box=box.SIMPLE, pad_edge=False,
              collapse_padding=True)
    for col in ("step", "rate", "verdict", "requests", "ok/s", "out tok/s", "TTFT p95",
                "TPOT p95", "errors", "valid"):
        t.add_column(col, justify="right")
    for i, s in enumerate(doc["steps"]):
        t.add_row(f"{i + 1}{' (confirm)' if s['confirmation'] else ''}", f"{s['rate']:.2f}",
                  s["verdict"], str(s["requests"]),
                  f"{s['throughput_rps']:.2f}", f"{s['output_tps']:.0f}",
                  _ms(s["ttft"]["p95_ms"]), _ms(s["tpot"]["p95_ms"]), f"{s['error_rate']:.2%}",
                  "yes" if s["valid"] else "NO")
    _wide(c, 110).print(t)
    c.print(availability_line(doc))
    if doc["capacity_rps"] is None:
        confirmed = any(s["confirmation"] for s in doc["steps"])
        c.print(doc["answer"] if confirmed else f"no tried rate met {doc['slo']}")
        return
    lo, hi = doc["interval_rps"]
    c.print(f"{doc['answer']}; interval [{_ms(lo)}, {_ms(hi)}] req/s"
            + ("" if doc["converged"] else " (not converged)"))
    c.print(f"at capacity: {doc['capacity_output_tps']:.0f} output tokens/s (goodput "
            f"{doc['capacity_goodput_tps']:.0f} tokens/s)")
    cost = doc["cost_per_1k_output_tokens_usd"]
    if cost is not None:
        c.print(f"cost at capacity: ${cost:.5f} per 1,000 output tokens at "
                f"${doc['price_per_hour_usd']:.3f}/hour")


llm.add_command(sessions_cmd)
