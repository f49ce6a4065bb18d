"""The Grafana dashboard of scalelab's servers, built from the metric catalog and the SLOs.

One dashboard (Grafana's JSON model, schemaVersion 39), a row per server: the tabular model
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

from typing import Any

from scalelab.core.errors import BadInputError
from scalelab.observe.catalog import metric_of
from scalelab.observe.promql import metric_names
from scalelab.observe.rules import PAGE, TICKET, Slo, recorded_names, rules_document

SCHEMA_VERSION = 39
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


class _Builder:
    def __init__(self, datasource: str) -> None:
        self.ds = {"type": "prometheus", "uid": "${datasource}"}
        self.datasource = datasource
        self.panels: list[dict[str, Any]] = []
        self.next_id = 1
        self.y = 0
        self.x = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        if self.x:
            self.y += _HEIGHT
            self.x = 0
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, title: str, targets: list[tuple[str, str]], *, unit: str,
              description: str = "", kind: str = "timeseries") -> None:
        panel: dict[str, Any] = {
            "id": self._id(), "type": kind, "title": title, "description": description,
            "datasource": self.ds,
            "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom",
                                   "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [{"refId": chr(ord("A") + i), "datasource": self.ds, "expr": expr,
                         "legendFormat": legend, "range": True}
                        for i, (legend, expr) in enumerate(targets)],
        }
        self.panels.append(panel)
        self.x += _WIDTH
        if self.x >= 24:
            self.x = 0
            self.y += _HEIGHT


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
    b.panel("Retrieval latency", quantiles("retrieval_request_seconds", "route"), unit="s")
    b.panel("Requests, errors and refusals", [
        ("{{route}} {{code}}", f"sum by (route, code) (rate(retrieval_requests_total[{RATE}]))"),
        ("refused by admission", f"sum(rate(retrieval_rejected_total[{RATE}]))"),
        ("in flight", "sum(retrieval_inflight)"),
        ("index vectors", "sum(retrieval_index_vectors)"),
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


def _budgets(b: _Builder, slos: list[Slo]) -> None:
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


def _by(slo: Slo) -> str:
    return {"serve": "model", "llm": "model_name"}.get(slo.stage, "")


def dashboard(slos: list[Slo], *, datasource: str = "Prometheus",
              title: str = "scalelab servers") -> dict[str, Any]:
    """The dashboard's JSON model; raises BadInputError if an expression does not parse or
    reads a metric that is neither exported (the catalog) nor recorded (the rules)."""
    b = _Builder(datasource)
    _serve(b)
    _generate(b)
    _retrieval(b)
    _governance(b)
    _budgets(b, slos)
    known = recorded_names(rules_document(slos))
    for p in b.panels:
        for t in p.get("targets", []):
            for name in metric_names(t["expr"]):
                if name not in known and metric_of(name) is None:
                    raise BadInputError(f"panel {p['title']!r} reads {name!r}, which no server "
                                        "exports and no rule records")
    return {
        "uid": UID, "title": title, "tags": ["scalelab"], "timezone": "utc",
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True,
        "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {"text": datasource, "value": datasource},
            "hide": 0, "refresh": 1, "options": [], "regex": ""}]},
        "annotations": {"list": []},
        "panels": b.panels,
    }


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

