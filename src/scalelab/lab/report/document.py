"""Write the report: one self-contained HTML file, a Markdown summary and a JSON document.

Everything is rebuilt from stored records and the objectives, so `scalelab report DIR` gives
the same report as the run that measured it.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scalelab.lab.core.economics import review_lines, unit_costs
from scalelab.lab.core.machine import Machine
from scalelab.lab.core.objectives import Check
from scalelab.lab.core.records import Record
from scalelab.lab.core.serialize import JSON_SCHEMA_VERSION, jsonable
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.units import (
    format_bytes,
    format_metric,
    format_multiple,
    format_number,
    format_percent,
    format_usd,
    sig,
)
from scalelab.lab.core.verdict import StageGoal, StageVerdict, Verdict
from scalelab.lab.report import plots
from scalelab.lab.report.verdict_text import (
    candidate_lines,
    decided_text,
    gap_text,
    headline,
    open_text,
    stage_advice,
    stage_head,
    tightest_text,
    verdict_lines,
)
from scalelab.layers.observe.traces import diagnosis_attributions

NOT_MEASURED = "not measured"
"""A sheet cell the stage did not measure (never a default number)."""


@dataclass(frozen=True, kw_only=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path


def _fmt(v: float | None) -> str:
    return format_number(v)


def _mem(v: int | None) -> str:
    return NOT_MEASURED if v is None else format_bytes(v)


SHEET_COLUMNS = [
    "stage",
    "series",
    "level",
    "×",
    "input",
    "rate",
    "limiting resource",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "peak memory",
    "failure rate",
    "quality",
    "cost/unit",
    "recovery",
    "energy/unit",
]


def sheet_cells(r: SheetRow) -> list[str]:
    """One sheet row as text: every cell a measured value or "not measured"."""
    nm = NOT_MEASURED

    def num(v: float | None) -> str:
        return nm if v is None else format_number(v)

    why = r.extras.get("quality_not_measured")  # a stage that tried says why it could not
    q = ", ".join(f"{k}={format_number(v)}" for k, v in list(r.quality.items())[:4]) or (
        f"{nm} ({why})" if isinstance(why, str) and why else nm)
    cost = nm if r.cost_per_unit_usd is None else (
        f"{format_usd(r.cost_per_unit_usd)}/{r.cost_unit or 'unit'}")
    rate = nm if r.rate is None else format_number(r.rate, r.rate_unit or "")
    if r.rate_min is not None and r.rate_max is not None and r.repeats > 1:
        rate += f" [{format_number(r.rate_min)}–{format_number(r.rate_max)}]"
    inp = nm if r.input_volume is None else format_number(r.input_volume, r.input_unit or "")
    return [
        r.stage,
        r.series or "—",
        sig(r.level),
        sig(r.multiple),
        inp,
        rate,
        r.limiting_resource or nm,
        num(r.p50_ms),
        num(r.p95_ms),
        num(r.p99_ms),
        _mem(r.peak_memory_bytes),
        nm if r.failure_rate is None else format_percent(r.failure_rate),
        q,
        cost,
        r.recovery or "none",
        energy_cell(r),
    ]


def energy_cell(r: SheetRow) -> str:
    """Joules per cost unit and whether they were measured or estimated."""
    if r.energy_per_unit_j is None:
        return NOT_MEASURED
    basis = "measured" if (r.energy_basis or "").startswith("measured") else "estimated"
    return f"{format_number(r.energy_per_unit_j)} J/{r.cost_unit or 'unit'} ({basis})"


def economics_html(sheet: list[SheetRow]) -> list[str]:
    """The weekly review's table: cost and energy per unit at every measured level."""
    e = html.escape
    costs = unit_costs(sheet)
    if not costs:
        return []
    out = ["<h2>Unit economics (weekly review)</h2><ul>",
           *(f"<li>{e(line)}</li>" for line in review_lines(costs)),
           "</ul><table><tr>" + "".join(
               f"<th class='l'>{c}</th>" for c in ("stage", "series", "level", "unit",
                                                   "$ / unit", "J / unit", "energy basis",
                                                   "$ / run", "J / run")) + "</tr>"]
    for u in costs:
        cells = [u.stage, u.series or "—", f"{u.variable} {sig(u.level)}", u.unit,
                 format_usd(u.usd_per_unit), _fmt(u.j_per_unit), u.energy_basis or "—",
                 format_usd(u.usd_per_run), _fmt(u.j_per_run)]
        out.append("<tr>" + "".join(f"<td class='l'>{e(c)}</td>" for c in cells) + "</tr>")
    out.append("</table><p class='muted'>From the one price table; energy estimated as "
               "core-seconds × watts per core where RAPL is not readable.</p>")
    return out


CHECK_COLUMNS = ["stage", "series", "×", "objective", "outcome", "value", "n", "bounds", "rule",
                 "what would decide it"]


def check_cells(c: Check, *, curve: bool = False) -> list[str]:
    """One check as text: its outcome (a curve point says so), value, sample size, bounds
    and rule."""
    d, metric = c.decision, c.objective.metric
    conf = f" ({d.confidence:.0%})" if d.confidence is not None else ""
    bounds = "—" if d.lower is None and d.upper is None else (
        f"{format_metric(metric, d.lower)}–{format_metric(metric, d.upper)}{conf}")
    return [c.stage, c.series or "—", sig(c.multiple), c.objective.label,
            d.outcome + (" (curve point)" if curve else ""),
            format_metric(metric, d.value),
            "not recorded" if d.n is None and d.value is not None else (
                "—" if d.n is None else f"{d.n:,}"),
            bounds, d.basis, d.need or "—"]


def _check_json(c: Check, curve: tuple[float, ...]) -> dict[str, Any]:
    d = c.decision
    return {"level": c.level, "multiple": c.multiple, "series": c.series,
            "objective": c.objective.label, "metric": c.objective.metric,
            "outcome": d.outcome, "value": c.value, "n": d.n, "lower": d.lower,
            "upper": d.upper, "confidence": d.confidence, "rule": d.basis, "needs": d.need,
            "purpose": "curve" if c.multiple in curve else "decision"}


def _miss_json(c: Check | None) -> dict[str, Any] | None:
    return None if c is None else {"objective": c.objective.label, "metric": c.objective.metric,
                                   "multiple": c.multiple, "level": c.level, "value": c.value}


def _stage_json(s: StageVerdict) -> dict[str, Any]:
    """One stage of the verdict object as data (the text fields are rendered from it)."""
    reach = s.reach
    return {
        "stage": s.stage,
        "measured": s.measured,
        "outcome": s.outcome,
        "failure": s.failure,
        "miss": _miss_json(s.miss),
        "passed_up_to": s.passed_up_to,
        "target_multiple": None if math.isnan(s.target_multiple) else s.target_multiple,
        "capacity": None if reach is None else {
            "multiple": reach.multiple, "target": reach.target, "holds": reach.holds,
            "rate": reach.rate, "rate_unit": reach.rate_unit},
        "decided": decided_text(s) if s.measured else "",
        "undecided": open_text(s),
        "needs": [{"objective": n.check.objective.label, "multiple": n.check.multiple,
                   "samples": n.samples, "measured": n.measured, "unit": n.unit,
                   "per_second": n.per_second, "seconds": n.seconds} for n in s.needs],
        "not_measured": [gap_text(g) for g in s.not_measured],
        "curve_multiples": list(s.curve_multiples),
        "limiting": [{"resource": e.resource, "evidence": e.detail} for e in s.limiting],
        "action": s.advice.headline,
        "intervention": s.intervention,
        "predicted": s.predicted,
        "tightest": tightest_text(s),
        "cost": [{"multiple": c.multiple, "usd_per_unit": c.usd, "unit": c.unit}
                 for c in s.cost],
        "candidates": candidate_lines(s),
        "checks": [_check_json(c, s.curve_multiples)
                   for c in [*s.checks, *s.candidate_checks]],
    }


def report_json(
    sheet: list[SheetRow],
    verdict: Verdict,
    machine: Machine,
    meta: dict[str, Any],
    run: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as one JSON document (what `diagnose --json` and `report --json` print);
    `run` adds what the run knew beyond its records (experiment id, failed steps)."""
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        **(run or {}),
        "generated": datetime.now(UTC).isoformat(),
        "machine": machine.to_dict(),
        "meta": meta,
        "verdict": {
            "summary": headline(verdict),
            "outcome": verdict.outcome,
            "first": None if verdict.first is None else verdict.first.stage,
            "stages": [_stage_json(s) for s in verdict.stages],
        },
        "sheet": jsonable(sheet),
        "unit_economics": {"review": review_lines(unit_costs(sheet)),
                           "rows": jsonable(unit_costs(sheet))},
    }


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1200px;color:#1d2430;padding:0 1rem}
h1{font-size:1.6rem}
h2{border-bottom:1px solid #ccd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;font-size:.8rem;margin:.5rem 0}
th,td{border:1px solid #dde;padding:.25rem .45rem;text-align:right}
th{background:#f2f4f8}
td.l,th.l{text-align:left}
.verdict{background:#fff6e5;border-left:4px solid #e8a200;padding:.8rem 1rem;font-size:1rem}
.ok{color:#137333}
.miss{color:#b3261e;font-weight:600}
.open{color:#8a5a00;font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:1rem}
.plots svg{max-width:560px;height:auto}
.muted{color:#667}
code{background:#f2f4f8;padding:0 .2rem}
"""


def stage_governance(rows: list[SheetRow]) -> str | None:
    """The governance cell of a stage's rows (its server's limits, budgets and kill switches),
    or None when the stage serves nothing."""
    return next((r.governance for r in rows if r.governance), None)


def _plain_quality(rows: list[SheetRow], objective_key: str | None) -> str | None:
    """The absolute quality metric behind a delta objective (e.g. macro_f1 for its delta)."""
    keys = {k for r in rows for k in r.quality}
    for cand in (
        objective_key.replace("_delta_points", "").replace("_delta", "") if objective_key else "",
        "macro_f1",
        "f1_macro",
        "accuracy",
    ):
        if cand and cand in keys:
            return cand
    return objective_key if objective_key in keys else None


def render_html(
    sheet: list[SheetRow],
    verdict: Verdict,
    goals: list[StageGoal],
    machine: Machine,
    meta: dict[str, Any],
    traces: dict[str, list[tuple[str, str]]] | None = None,
    records: list[Record] | None = None,
) -> str:
    e = html.escape
    out: list[str] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>scalelab diagnosis</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>scalelab diagnosis</h1>",
        f"<p class='muted'>Machine: {machine.cores} cores, "
        f"{machine.memory_bytes / 2**30:.1f} GiB, {e(machine.device)} · mode "
        f"{e(str(meta.get('mode', '')))} · {e(str(meta.get('generated', '')))}</p>",
        "<h2>Verdict</h2>",
        f"<div class='verdict'>{e(headline(verdict))}</div>",
    ]
    goal_by = {g.stage: g for g in goals}
    for s in verdict.stages:
        out.append(f"<h2>{e(s.stage)}</h2>")
        if not s.measured:
            out.append(f"<p class='miss'>{e(stage_head(s)[0].split(': ', 1)[1])}</p>"
                       if s.failure else "<p class='muted'>not measured in this run</p>")
            continue
        rows = [r for r in sheet if r.stage == s.stage]
        g = goal_by.get(s.stage)
        out += _stage_findings_html(s, g, rows, (traces or {}).get(s.stage, []))
        out += _stage_figures_html(s.stage, g, rows, records or [])
    if meta.get("time"):  # how the time was spent (diagnose.budget.time_lines)
        out += ["<h2>Time</h2><ul>", *(f"<li>{e(str(ln))}</li>" for ln in meta["time"]),
                "</ul>"]
    out += economics_html(sheet)
    out += _sheet_html(sheet)
    return "\n".join(out)


def _stage_findings_html(s: StageVerdict, g: StageGoal | None, rows: list[SheetRow],
                         traces: list[tuple[str, str]]) -> list[str]:
    """A measured stage's objectives, outcome, evidence and checks."""
    e = html.escape
    out: list[str] = []
    if g:
        out.append(
            "<p>Objectives: "
            + ", ".join(f"<code>{e(o.label)}</code>" for o in g.objectives)
            + f" · target {format_multiple(g.target_multiple)}</p>"
        )
    head = stage_head(s)
    cls = {"missed": "miss", "failed": "miss", "met": "ok"}.get(s.outcome, "open")
    out.append(f"<p><span class='{cls}'>{e(head[0].split(': ', 1)[1])}</span></p><ul>")
    for line in head[1:]:
        out.append(f"<li>{e(line.strip())}</li>")
    for ev in s.limiting:
        out.append(f"<li>limiting: <b>{e(ev.resource)}</b> — {e(ev.detail)}</li>")
    out += [f"<li>{label}: {e(text)}</li>" for label, text in stage_advice(s)]
    gov = stage_governance(rows)
    if gov:
        out.append(f"<li>governance: {e(gov)}</li>")
    for tag, line in traces:
        out.append(f"<li>traces ({e(tag)}, highest level): {e(line)}</li>")
    out.append("</ul>")
    if s.checks or s.candidate_checks:
        out.append("<table><tr>" + "".join(f"<th class='l'>{e(c)}</th>"
                                            for c in CHECK_COLUMNS[1:]) + "</tr>")
        for c in [*s.checks, *s.candidate_checks]:
            cells = check_cells(c, curve=c.multiple in s.curve_multiples)[1:]
            kind = {"missed": "miss", "met": "ok"}.get(c.outcome, "open")
            out.append("<tr>" + "".join(
                f"<td class='l{' ' + kind if i == 3 else ''}'>{e(x)}</td>"
                for i, x in enumerate(cells)) + "</tr>")
        out.append("</table>")
    return out


def _stage_figures_html(stage: str, g: StageGoal | None, rows: list[SheetRow],
                        records: list[Record]) -> list[str]:
    """A measured stage's plots."""
    objs = g.objectives if g else []
    figures: tuple[str | None, ...]
    if rows and rows[0].variable == "variant":
        # Variants are categories, not a scale: compare them on one quality-latency plane.
        qkey = next((o.metric[8:] for o in objs if o.metric.startswith("quality:")), None)
        figures = (plots.pareto_plot(stage, rows, _plain_quality(rows, qkey)),)
    else:
        figures = (
            plots.throughput_plot(stage, rows, objs),
            plots.latency_plot(stage, rows, objs),
            plots.cost_plot(stage, rows),
            plots.frontier_plot(stage, records),
            plots.monthly_plot(stage, records),
        )
    return ["<div class='plots'>", *(f"<figure>{svg}</figure>" for svg in figures if svg),
            "</div>"]


def _sheet_html(sheet: list[SheetRow]) -> list[str]:
    """The diagnostic sheet as a table, and the closing of the page."""
    e = html.escape
    out = [
        "<h2>Diagnostic sheet</h2><table><tr>"
        + "".join(f"<th class='l'>{e(c)}</th>" for c in SHEET_COLUMNS)
        + "</tr>"
    ]
    for r in sheet:
        cells = sheet_cells(r)
        out.append(
            "<tr>"
            + "".join(
                f"<td class='{'l' if i in (0, 1, 6, 12, 14) else ''}'>{e(c)}</td>"
                for i, c in enumerate(cells)
            )
            + "</tr>"
        )
    out.append(
        "</table><p class='muted'>Medians over repeats; rate ranges in brackets. "
        "× is the multiple of the stage's smallest level. Rebuild with "
        "<code>scalelab report DIR</code>.</p></body></html>"
    )
    return out


def render_markdown(
    sheet: list[SheetRow], verdict: Verdict, machine: Machine, meta: dict[str, Any],
    traces: dict[str, list[tuple[str, str]]] | None = None,
) -> str:
    lines = [
        "# scalelab diagnosis",
        "",
        f"Machine: {machine.cores} cores, {machine.memory_bytes / 2**30:.1f} GiB, "
        f"{machine.device}; mode {meta.get('mode', '')}",
        "",
        "## Verdict",
        "",
    ]
    lines += [
        f"- {ln.strip()}" if ln.startswith("  ") else f"**{ln}**" if i == 0 else f"- {ln}"
        for i, ln in enumerate(verdict_lines(verdict))
    ]
    checks = [(c, c.multiple in s.curve_multiples) for s in verdict.stages
              for c in [*s.checks, *s.candidate_checks]]
    if checks:
        lines += ["", "## Checks", "", "| " + " | ".join(CHECK_COLUMNS) + " |",
                  "|" + "---|" * len(CHECK_COLUMNS)]
        lines += ["| " + " | ".join(x.replace("|", "/") for x in check_cells(c, curve=k))
                  + " |" for c, k in checks]
    if meta.get("time"):  # how the time was spent (diagnose.budget.time_lines)
        lines += ["", "## Time", "", *(f"- {ln}" for ln in meta["time"])]
    review = review_lines(unit_costs(sheet))
    if review:
        lines += ["", "## Unit economics (weekly review)", "", *(f"- {ln}" for ln in review)]
    governed = [(s, g) for s in dict.fromkeys(r.stage for r in sheet)
                if (g := stage_governance([r for r in sheet if r.stage == s]))]
    if governed:
        lines += ["", "## Governance", "", *(f"- {s}: {g}" for s, g in governed)]
    if traces:
        lines += ["", "## Traces (p99 attribution, highest level)", "",
                  *(f"- {s} ({tag}): {line}" for s, rows in traces.items()
                    for tag, line in rows)]
    lines += [
        "",
        "## Sheet",
        "",
        "| " + " | ".join(SHEET_COLUMNS) + " |",
        "|" + "---|" * len(SHEET_COLUMNS),
    ]
    for r in sheet:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in sheet_cells(r)) + " |")
    return "\n".join(lines) + "\n"


def write_report(
    out_dir: Path,
    sheet: list[SheetRow],
    verdict: Verdict,
    goals: list[StageGoal],
    machine: Machine,
    meta: dict[str, Any],
    *,
    run: dict[str, Any] | None = None,
    records: list[Record] | None = None,
) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    files = ReportFiles(
        html=out_dir / "report.html", markdown=out_dir / "report.md", json=out_dir / "report.json"
    )
    paths = {"html": str(files.html), "markdown": str(files.markdown), "json": str(files.json)}
    # the span files the stages left (OUT/traces): where each stage's p99 went
    traces = diagnosis_attributions(out_dir)
    run = {**(run or {}), "out": str(out_dir), "report": paths,
           "traces": {s: [{"tag": t, "line": ln} for t, ln in rows]
                      for s, rows in traces.items()}}
    for path, text in (
        (files.html, render_html(sheet, verdict, goals, machine, meta, traces, records)),
        (files.markdown, render_markdown(sheet, verdict, machine, meta, traces)),
        (
            files.json,
            json.dumps(
                report_json(sheet, verdict, machine, meta, run), indent=2, allow_nan=False
            )
            + "\n",
        ),
    ):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return files
