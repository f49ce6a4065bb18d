"""The Grafana dashboard of scalelab's servers, built from the metric catalog and the SLOs.

One dashboard, a row per server, built with grafana-foundation-sdk's builders (so its JSON is
what Grafana's own typed models emit; the SDK's 11.6 release, schemaVersion 41): the tabular model
server (latency percentiles from its histograms, request rate and errors, queue depth and
in-flight requests, batch size, where a request's time goes, response-cache hit rate), the
generation engine (TTFT and inter-token latency, tokens/s, running and waiting sequences, KV-cache
usage, prefix-cache hit rate), the retrieval server (latency by route, requests and refusals,
index size), governance (budget spent against its limit, refusals by reason) and the error
budgets (burn rate of every SLO over the alert windows, read from the recording rules). Every
expression is checked by `observe.promql` when the dashboard is built, and every metric it reads
must be in the catalog or recorded by the rules, so a panel cannot point at nothing.
"""

from __future__ import annotations

import json
from typing import Any

from scalelab.lab.core.errors import BadInputError, import_optional
from scalelab.layers.observe.catalog import metric_of
from scalelab.layers.observe.promql import metric_names
from scalelab.layers.observe.rules import PAGE, TICKET, RatioSlo, recorded_names, rules_document

INSTALL_HINT = "pip install 'scalelab[observe]'"
UID = "scalelab-servers"
RATE = "$__rate_interval"
_WIDTH = 12
_HEIGHT = 8


def quantiles(histogram: str, by: str, *, selector: str = "",
              qs: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[tuple[str, str]]:
    """(legend, expr) of histogram_quantile over the rate of the buckets, one per quantile."""
    sel = "{" + selector + "}" if selector else ""
    return [(f"p{q * 100:g} {{{{{by}}}}}" if by else f"p{q * 100:g}",
             f"histogram_quantile({q:g}, sum by (le{', ' + by if by else ''}) "
             f"(rate({histogram}_bucket{sel}[{RATE}])))") for q in qs]


def _sdk() -> Any:
    return import_optional(
        "grafana_foundation_sdk",
        needed_for="the Grafana dashboard is built with grafana-foundation-sdk", hint=INSTALL_HINT)


class _Builder:
    """Rows and panels through grafana-foundation-sdk's builders, which lay them out on the
    24-column grid (a row starts a new line, panels fill it left to right) and emit what
    Grafana's own typed models emit."""

    def __init__(self, datasource: str, title: str) -> None:
        _sdk()
        from grafana_foundation_sdk.builders import dashboard as db
        from grafana_foundation_sdk.models import dashboard as dm

        self.datasource = datasource
        self.ds = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
        self.board = (
            db.Dashboard(title).uid(UID).tags(["scalelab"]).timezone("utc").editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-1h", "now")
            .version(1)
            .with_variable(db.DatasourceVariable("datasource").label("Prometheus")
                           .type("prometheus").current(dm.VariableOption(
                               text=datasource, value=datasource))))
        self.titles: dict[int, str] = {}
        """Panel id -> title, for the metric check's messages."""
        self.exprs: list[tuple[str, str]] = []
        """(panel title, expression) of every target."""
        self.next_id = 1

    def _id(self, title: str) -> int:
        self.next_id += 1
        self.titles[self.next_id - 1] = title
        return self.next_id - 1

    def row(self, title: str) -> None:
        from grafana_foundation_sdk.builders import dashboard as db

        self.board.with_row(db.Row(title).id(self._id(title)).collapsed(False))

    def panel(self, title: str, targets: list[tuple[str, str]], *, unit: str,
              description: str = "") -> None:
        from grafana_foundation_sdk.builders import common as cb
        from grafana_foundation_sdk.builders import prometheus as pb
        from grafana_foundation_sdk.builders import timeseries as ts
        from grafana_foundation_sdk.models import common as cm

        panel = (ts.Panel().id(self._id(title)).title(title).description(description)
                 .datasource(self.ds).height(_HEIGHT).span(_WIDTH).unit(unit)
                 .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                         .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
                 .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                          .sort(cm.SortOrder.DESCENDING)))
        for i, (legend, expr) in enumerate(targets):
            panel.with_target(pb.Dataquery().ref_id(chr(ord("A") + i)).datasource(self.ds)
                              .expr(expr).legend_format(legend).range())
            self.exprs.append((title, expr))
        self.board.with_panel(panel)

    def json(self) -> dict[str, Any]:
        from grafana_foundation_sdk.cog.encoder import JSONEncoder

        out: dict[str, Any] = json.loads(json.dumps(self.board.build(), cls=JSONEncoder))
        return out


def _serve(b: _Builder) -> None:
    b.row("Tabular model server (scalelab serve)")
    b.panel("Latency p50 / p95 / p99", quantiles("scalelab_request_duration_seconds", "model"),
            unit="s", description="End-to-end in the server, from its histogram (merges "
                                  "across worker processes).")
    b.panel("Requests and errors", [
        ("{{model}} {{status}}",
         f"sum by (model, status) (rate(scalelab_responses_total[{RATE}]))"),
        ("errors {{model}}", f'sum by (model) (rate(scalelab_responses_total{{status=~"5..|429"}}'
                             f"[{RATE}]))"),
    ], unit="reqps", description="Responses by HTTP status; errors are 5xx and 429 (shed).")
    b.panel("Queue depth and in-flight", [
        ("queued {{model}}", "sum by (model) (scalelab_queue_depth)"),
        ("in flight {{model}}", "sum by (model) (scalelab_inflight_requests)"),
    ], unit="short", description="Queue depth leads latency: the autoscaling signal.")
    b.panel("Batch size", [
        *quantiles("scalelab_batch_size", "model", qs=(0.5, 0.95)),
        ("mean {{model}}", f"sum by (model) (rate(scalelab_batch_size_sum[{RATE}])) / "
                           f"sum by (model) (rate(scalelab_batch_size_count[{RATE}]))"),
    ], unit="short", description="Rows per forward pass.")
    b.panel("Where the time goes (p95)", [
        (f"{what} {{{{model}}}}", quantiles(h, "model", qs=(0.95,))[0][1])
        for what, h in (("queue wait", "scalelab_queue_wait_seconds"),
                        ("batch formation", "scalelab_batch_formation_seconds"),
                        ("compute", "scalelab_compute_seconds"))
    ], unit="s", description="Queue wait, waiting for batch-mates, and the forward pass.")
    b.panel("Response-cache hit rate", [
        ("{{model}}", f"sum by (model) (rate(scalelab_cache_hits_total[{RATE}])) / "
                      f"(sum by (model) (rate(scalelab_cache_hits_total[{RATE}])) + "
                      f"sum by (model) (rate(scalelab_cache_misses_total[{RATE}])))"),
    ], unit="percentunit")


def _generate(b: _Builder) -> None:
    b.row("Generation engine (scalelab generate serve; vLLM metric names)")
    b.panel("Time to first token", quantiles("vllm:time_to_first_token_seconds", "model_name"),
            unit="s")
    b.panel("Inter-token latency", [
        *quantiles("vllm:inter_token_latency_seconds", "model_name"),
        *(("TPOT " + legend, e) for legend, e in
          quantiles("vllm:request_time_per_output_token_seconds", "model_name", qs=(0.95,))),
    ], unit="s")
    b.panel("Tokens per second", [
        ("output {{model_name}}", f"sum by (model_name) "
                                  f"(rate(vllm:generation_tokens_total[{RATE}]))"),
        ("prompt {{model_name}}", f"sum by (model_name) (rate(vllm:prompt_tokens_total[{RATE}]))"),
    ], unit="short")
    b.panel("Running and waiting sequences", [
        ("running {{model_name}}", "sum by (model_name) (vllm:num_requests_running)"),
        ("waiting {{model_name}}", "sum by (model_name) (vllm:num_requests_waiting)"),
        ("preemptions/s {{model_name}}",
         f"sum by (model_name) (rate(vllm:num_preemptions_total[{RATE}]))"),
    ], unit="short", description="Waiting sequences lead TTFT: the autoscaling signal.")
    b.panel("KV-cache usage", [
        ("{{model_name}}", "max by (model_name) (vllm:kv_cache_usage_perc)")],
        unit="percentunit")
    b.panel("Prefix-cache hit rate", [
        ("{{model_name}}", f"sum by (model_name) (rate(vllm:prefix_cache_hits_total[{RATE}])) / "
                           f"sum by (model_name) (rate(vllm:prefix_cache_queries_total[{RATE}]))"),
    ], unit="percentunit", description="Prompt blocks found cached / looked up, over the "
                                       "interval (not since start).")


def _retrieval(b: _Builder) -> None:
    b.row("Retrieval server (scalelab retrieval serve)")
    b.panel("Retrieval latency", quantiles("scalelab_retrieval_request_seconds", "route"), unit="s")
    b.panel("Requests, errors and refusals", [
        ("{{route}} {{code}}",
         f"sum by (route, code) (rate(scalelab_retrieval_requests_total[{RATE}]))"),
        ("refused by admission", f"sum(rate(scalelab_retrieval_rejected_total[{RATE}]))"),
        ("in flight", "sum(scalelab_retrieval_inflight)"),
        ("index vectors", "sum(scalelab_retrieval_index_vectors)"),
    ], unit="short")


def _governance(b: _Builder) -> None:
    b.row("Governance (budgets, limits, kill switches)")
    b.panel("Budget spent", [
        ("{{client}} {{model}} {{unit}}/{{period}}", "scalelab:budget_used:ratio")],
        unit="percentunit", description="scalelab_budget_used / scalelab_budget_limit: a "
                                        "ticket at 90%, a page at 100% (load is shed).")
    b.panel("Refusals by reason", [
        ("{{client}} {{model}} {{reason}}",
         f"sum by (client, model, reason) (rate(scalelab_governance_refusals_total[{RATE}]))")],
        unit="reqps", description="Rate limits, concurrency caps, budgets and kill switches.")
    b.panel("Kill switches and in-flight per client", [
        ("stopped {{kind}} {{name}}", "max by (kind, name) (scalelab_governance_stopped)"),
        ("in flight {{client}}", "sum by (client) (scalelab_governance_inflight)")],
        unit="short", description="1 while an operator's kill switch holds a model or a "
                                  "client's traffic (reversible: /admin/governance/.../release).")


def _budgets(b: _Builder, slos: list[RatioSlo]) -> None:
    if not slos:
        return
    b.row("Error budgets (burn rate: 1 spends the budget exactly over the period)")
    windows = sorted({w for pairs in (PAGE, TICKET) for pair in pairs for w in pair[:2]},
                     key=lambda w: ("m", "h", "d").index(w[-1]) * 1000 + int(w[:-1]))
    for slo in slos:
        b.panel(f"{slo.label} ({slo.stage})", [
            (f"{w} {{{{{by}}}}}" if (by := _by(slo)) else w,
             f"{slo.record_name(w)} / {slo.budget:.6g}") for w in windows],
            unit="short",
            description="Pages at 14.4x over 1h and 5m or 6x over 6h and 30m; a ticket at 1x "
                        "over 3d and 6h (the SRE workbook's multi-window, multi-burn-rate).")


def _by(slo: RatioSlo) -> str:
    return {"serve": "model", "llm": "model_name"}.get(slo.stage, "")


def dashboard(slos: list[RatioSlo], *, datasource: str = "Prometheus",
              title: str = "scalelab servers") -> dict[str, Any]:
    """The dashboard's JSON model; raises BadInputError if an expression does not parse or
    reads a metric that is neither exported (the catalog) nor recorded (the rules)."""
    b = _Builder(datasource, title)
    _serve(b)
    _generate(b)
    _retrieval(b)
    _governance(b)
    _budgets(b, slos)
    known = recorded_names(rules_document(slos))
    for title_, expr in b.exprs:
        for name in metric_names(expr):
            if name not in known and metric_of(name) is None:
                raise BadInputError(f"panel {title_!r} reads {name!r}, which no server "
                                    "exports and no rule records")
    return b.json()


def metrics_used(board: dict[str, Any]) -> dict[str, set[str]]:
    """Exported metric names the dashboard reads, by server (what a scrape must expose)."""
    out: dict[str, set[str]] = {}
    for p in board["panels"]:
        for t in p.get("targets", []):
            for name in metric_names(t["expr"]):
                m = metric_of(name)
                if m is not None:
                    out.setdefault(m.server, set()).add(name)
    return out

