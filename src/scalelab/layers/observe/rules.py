"""Prometheus recording and alerting rules: error budgets burned at several speeds, and budgets.

Service-level objectives come from the objectives file `scalelab diagnose` reads (its
`stages.<name>.objectives`; the packaged defaults.yaml when no file is given): an availability
objective ("availability ≥ 99.9%") and latency objectives ("p95 ≤ 50 ms"), the latter read as a
ratio SLO — at least 95% of requests within 50 ms — so the bad events are the requests above a
histogram bucket boundary. Each SLO gets one recording rule per window for its error ratio and
two alerts, multi-window and multi-burn-rate as in the Google SRE workbook ("Alerting on SLOs"):

- page: burn rate 14.4 over 1 h and over 5 min (2% of a 30-day budget in an hour), or 6 over
  6 h and over 30 min (5% in six hours);
- ticket: burn rate 1 over 3 days and over 6 h (the budget runs out exactly at the period end).

The short window makes an alert stop soon after the burn stops; the long one keeps a blip from
paging. A latency threshold that is not a bucket boundary is read at the largest boundary below
it (stricter: a request between the two counts as slow), and the rule says which boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.objectives import QUANTILE_OF
from scalelab.layers.observe.catalog import METRICS

WINDOWS = ("5m", "30m", "1h", "6h", "3d")
"""Every window an alert below reads, each a recording rule per SLO."""
PAGE = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
"""(long window, short window, burn rate) pairs that page."""
TICKET = (("3d", "6h", 1.0),)
"""(long window, short window, burn rate) pairs that open a ticket."""
BUDGET_WARN = 0.9
"""Share of a client's or model's budget spent at which a ticket opens (a page at 1.0)."""



@dataclass(frozen=True, kw_only=True)
class SloSource:
    """Where a stage's SLO is measured: the latency histogram and the responses counter."""

    histogram: str
    by: tuple[str, ...]
    """Labels the ratios keep (one alert per model)."""
    selector: str = ""
    """Matchers every series of this source takes (e.g. the retrieval route)."""
    responses: str | None = None
    """The responses counter and its matcher for a failed response (None: no availability)."""
    failed: str = ""
    latency_name: str = "latency"


SOURCES: dict[str, SloSource] = {
    "serve": SloSource(histogram="scalelab_request_duration_seconds", by=("model",),
                       responses="scalelab_responses_total", failed='status=~"5..|429"'),
    # the llm stage's latency objective is TTFT; the engine counts no failed responses
    "llm": SloSource(histogram="vllm:time_to_first_token_seconds", by=("model_name",),
                     latency_name="ttft"),
    "retrieval": SloSource(histogram="scalelab_retrieval_request_seconds", by=(),
                           selector='route="retrieve"',
                           responses="scalelab_retrieval_requests_total",
                           failed='code=~"5..|429"'),
}
"""The stages whose objectives become SLOs, and the server metrics that measure them."""


@dataclass(frozen=True, kw_only=True)
class RatioSlo:
    """One ratio SLO: the share of good events must stay at or above `target`."""

    name: str
    """e.g. serve_availability, serve_latency, llm_ttft."""
    stage: str
    label: str
    """The objective as people say it."""
    target: float
    """Good events / all events, e.g. 0.999."""
    bad: str
    """PromQL of the bad events' rate over `[W]` (W is replaced by each window)."""
    total: str
    """PromQL of all events' rate over `[W]`."""
    boundary_s: float | None = None
    """For a latency SLO: the bucket boundary the threshold is read at."""

    @property
    def budget(self) -> float:
        """The error budget: the share of events allowed to be bad."""
        return 1.0 - self.target

    def record_name(self, window: str) -> str:
        return f"scalelab:slo_{self.name}_errors:ratio_rate{window}"

    def ratio_expr(self, window: str) -> str:
        return f"({self.bad.replace('[W]', f'[{window}]')}) / " \
               f"({self.total.replace('[W]', f'[{window}]')})"


def le_matcher(boundary: float) -> str:
    """A matcher of one bucket's `le` label that holds whether the boundary is written "1.0"
    (prometheus-client, Prometheus 2) or "1" (Prometheus 3 normalises it)."""
    text = repr(float(boundary))
    if boundary == int(boundary):
        return f'le=~"{int(boundary)}|{int(boundary)}.0"'
    return f'le="{text}"'


def _sum(expr: str, by: tuple[str, ...]) -> str:
    return f"sum by ({', '.join(by)}) ({expr})" if by else f"sum({expr})"


def _sel(*parts: str) -> str:
    inner = ", ".join(p for p in parts if p)
    return "{" + inner + "}" if inner else ""


def latency_slo(stage: str, objective: dict[str, Any]) -> RatioSlo:
    """The ratio SLO of a percentile objective `{metric: p95_ms, max: 50}` (pure)."""
    src = SOURCES[stage]
    metric, bound = objective["metric"], objective.get("max")
    if bound is None or metric not in QUANTILE_OF:
        raise BadInputError(f"stages.{stage}: {metric} needs a max to become a latency SLO")
    buckets = METRICS[src.histogram].buckets
    threshold = float(bound) / 1000.0
    below = [b for b in buckets if b <= threshold * (1 + 1e-9)]
    if not below:
        raise BadInputError(
            f"stages.{stage}: {metric} ≤ {bound} ms is below the smallest bucket of "
            f"{src.histogram} ({buckets[0] * 1000:g} ms); raise the bound")
    boundary = below[-1]
    h = src.histogram
    good = _sum(f"rate({h}_bucket{_sel(src.selector, le_matcher(boundary))}[W])", src.by)
    total = _sum(f"rate({h}_count{_sel(src.selector)}[W])", src.by)
    q = QUANTILE_OF[metric]
    label = objective.get("label") or f"{metric.removesuffix('_ms')} ≤ {bound:g} ms"
    return RatioSlo(name=f"{stage}_{src.latency_name}", stage=stage, label=str(label), target=q,
                    bad=f"{total} - {good}", total=total, boundary_s=boundary)


def availability_slo(stage: str, objective: dict[str, Any]) -> RatioSlo | None:
    """The SLO of `{metric: availability, min: 0.999}`; None where the server counts no
    failed responses (pure)."""
    src = SOURCES[stage]
    if src.responses is None:
        return None
    target = objective.get("min")
    if target is None or not 0 < float(target) < 1:
        raise BadInputError(f"stages.{stage}: availability needs a min between 0 and 1 "
                            f"(e.g. 0.999) to become an SLO")
    c = src.responses
    bad = _sum(f"rate({c}{_sel(src.failed)}[W])", src.by)
    total = _sum(f"rate({c}[W])", src.by)
    label = objective.get("label") or f"availability ≥ {float(target):.3%}"
    return RatioSlo(name=f"{stage}_availability", stage=stage, label=str(label),
                    target=float(target), bad=bad, total=total)


def slos_from_objectives(doc: dict[str, Any]) -> list[RatioSlo]:
    """Every SLO the objectives document's serve, llm and retrieval stages define (pure)."""
    stages = doc.get("stages") or {}
    if not isinstance(stages, dict):
        raise BadInputError("objectives file: 'stages' must be a mapping of stage sections")
    out: list[RatioSlo] = []
    for stage in SOURCES:
        section = stages.get(stage) or {}
        objectives = section.get("objectives") or [] if isinstance(section, dict) else []
        latency_done = False
        for o in objectives:
            if not isinstance(o, dict) or "metric" not in o:
                raise BadInputError(f"stages.{stage}.objectives: each entry needs a metric "
                                    "(e.g. {metric: p95_ms, max: 50})")
            if o["metric"] in QUANTILE_OF and o.get("max") is not None and not latency_done:
                # one latency SLO per stage: the first percentile objective, which is the
                # tightest as the defaults write them (p95 before p99)
                out.append(latency_slo(stage, o))
                latency_done = True
            elif o["metric"] == "availability" and o.get("min") is not None:
                slo = availability_slo(stage, o)
                if slo is not None:
                    out.append(slo)
    return out


def default_objectives_path() -> Path:
    """The packaged objectives file (`scalelab diagnose`'s defaults), read as data."""
    return Path(__file__).resolve().parents[2] / "lab" / "diagnose" / "defaults.yaml"


def read_objectives(path: Path | None) -> dict[str, Any]:
    """The defaults with a user file's stage sections merged over them (objectives of a stage
    the user names replace the defaults' for that stage, as `scalelab diagnose` merges them)."""
    base = _yaml(default_objectives_path())
    if path is None:
        return base
    user = _yaml(path)
    stages = dict(base.get("stages") or {})
    theirs = user.get("stages") or {}
    if not isinstance(theirs, dict):
        raise BadInputError(f"{path}: 'stages' must be a mapping of stage sections "
                            "(stages: {serve: {objectives: [...]}})")
    for name, section in theirs.items():
        if not isinstance(section, dict):
            raise BadInputError(f"{path}: stages.{name} must be a mapping")
        stages[name] = {**(stages.get(name) or {}), **section}
    return {**base, "stages": stages}


def _yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInputError(f"objectives file {path}: {e.strerror}; pass an existing "
                            "YAML file (e.g. a copy of diagnose's defaults.yaml)") from None
    except yaml.YAMLError as e:
        raise BadInputError(f"objectives file {path} is not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise BadInputError(f"objectives file {path}: the top level must be a mapping")
    return doc


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def _burn(slo: RatioSlo, pairs: tuple[tuple[str, str, float], ...]) -> str:
    b = f"{slo.budget:.6g}"
    terms = [f"({slo.record_name(long)} > ({rate:g} * {b}) and "
             f"{slo.record_name(short)} > ({rate:g} * {b}))" for long, short, rate in pairs]
    return " or ".join(terms)


def slo_group(slo: RatioSlo) -> dict[str, Any]:
    """The recording rules and the two burn-rate alerts of one SLO (pure)."""
    rules: list[dict[str, Any]] = [
        {"record": slo.record_name(w), "expr": slo.ratio_expr(w)} for w in WINDOWS]
    where = (f" (requests above {slo.boundary_s * 1000:g} ms, the bucket boundary the "
             f"threshold is read at)" if slo.boundary_s is not None else "")
    common = {"slo": slo.name, "stage": slo.stage}
    for severity, pairs, what in (
            ("page", PAGE, "burning fast: at this rate the 30-day budget is gone in ≤ 5 days"),
            ("ticket", TICKET, "burning steadily: the budget runs out before the period ends")):
        rules.append({
            "alert": f"Scalelab{_camel(slo.name)}ErrorBudgetBurn{severity.capitalize()}",
            "expr": _burn(slo, pairs),
            "labels": {"severity": severity, **common},
            "annotations": {
                "summary": f"{slo.label}: error budget {what}",
                "description": f"Bad-event ratio{where} against a budget of "
                               f"{slo.budget:.4g}; windows "
                               + ", ".join(f"{rate:g}x over {long} and {short}"
                                           for long, short, rate in pairs) + "."},
        })
    return {"name": f"scalelab-slo-{slo.name}", "rules": rules}


def budget_group() -> dict[str, Any]:
    """Governance: the share of each client's and model's budget spent, and its alerts."""
    ratio = "scalelab:budget_used:ratio"
    return {"name": "scalelab-governance", "rules": [
        {"record": ratio, "expr": "scalelab_budget_used / scalelab_budget_limit"},
        {"alert": "ScalelabBudgetExhausted", "expr": f"{ratio} >= 1",
         "labels": {"severity": "page"},
         "annotations": {"summary": "{{ $labels.client }} spent its {{ $labels.period }} "
                                    "budget of {{ $labels.unit }} on {{ $labels.model }}: "
                                    "requests are being shed"}},
        {"alert": "ScalelabBudgetNearlySpent", "expr": f"{ratio} >= {BUDGET_WARN:g}",
         "labels": {"severity": "ticket"},
         "annotations": {"summary": "{{ $labels.client }} has spent "
                                    "{{ $value | humanizePercentage }} of its "
                                    "{{ $labels.period }} budget on {{ $labels.model }}"}},
        {"alert": "ScalelabKillSwitchEngaged",
         "expr": "max by (kind, name) (scalelab_governance_stopped) == 1",
         "labels": {"severity": "ticket"},
         "annotations": {"summary": "the kill switch holds {{ $labels.kind }} "
                                    "{{ $labels.name }}: release it when the cause is fixed"}},
    ]}


def rules_document(slos: list[RatioSlo]) -> dict[str, Any]:
    """The whole rules file: one group per SLO, then governance's (pure)."""
    return {"groups": [*(slo_group(s) for s in slos), budget_group()]}


def recorded_names(doc: dict[str, Any]) -> set[str]:
    """The series names the rules document records (what panels may read besides METRICS)."""
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
