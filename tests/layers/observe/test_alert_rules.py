"""The alert rules evaluated by Prometheus itself: `promtool test rules` runs the generated
rules file over synthetic series and checks, for every alert, a case where it must fire and one
where it must not.

The series and the expected alerts are written here from the SLO arithmetic (budget, burn rate,
windows), not read from the generator: a ratio of 0.5x the budget fires nothing, 3x opens only
the ticket (below the page's 6x and 14.4x), 16x pages as well, and once the burn stops the page
clears with its short windows while the ticket's 6 h window still holds it.

promtool comes with `make test` (extracted from Debian's prometheus package); where it is absent
the test skips and says why, except under SCALELAB_REQUIRE_PROMTOOL (CI), where it fails.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from promtool_bin import promtool
from scalelab.cli import run

RATE = 1000.0
"""Requests a minute in every synthetic series."""


def _cumulative(per_minute: list[float]) -> str:
    """A counter's samples, one a minute from 0, as promtool's space-separated values."""
    total, out = 0.0, ["0"]
    for x in per_minute:
        total += x
        out.append(f"{total:g}")
    return " ".join(out)


@dataclass(frozen=True)
class Case:
    slo: str
    alert: str
    """The alert name without its Page/Ticket suffix."""
    budget: float
    labels: dict[str, str]
    """The labels each firing alert carries besides alertname and severity."""
    series: Callable[[list[float]], list[dict[str, str]]]
    """Input series from the bad share of each minute's requests."""


def _serve_availability(bad: list[float]) -> list[dict[str, str]]:
    m = 'model="flights"'
    return [
        {"series": f'scalelab_responses_total{{{m},status="200"}}',
         "values": _cumulative([RATE * (1 - b) * 0.9 for b in bad])},
        {"series": f'scalelab_responses_total{{{m},status="503"}}',
         "values": _cumulative([RATE * b * 0.25 for b in bad])},
        {"series": f'scalelab_responses_total{{{m},status="429"}}',
         "values": _cumulative([RATE * b * 0.75 for b in bad])},
        # a 4xx (but 429) is the client's fault, not the service's: it counts as good
        {"series": f'scalelab_responses_total{{{m},status="422"}}',
         "values": _cumulative([RATE * (1 - b) * 0.1 for b in bad])},
    ]


def _histogram(name: str, labels: str, le: str, below: str) -> Callable[
        [list[float]], list[dict[str, str]]]:
    """A latency histogram whose `le` bucket holds the good requests; the smaller bucket
    `below` holds none, so a rule reading the wrong boundary would see every request slow."""
    sep = "," if labels else ""

    def series(bad: list[float]) -> list[dict[str, str]]:
        return [
            {"series": f"{name}_count{{{labels}}}", "values": _cumulative([RATE for _ in bad])},
            {"series": f'{name}_bucket{{{labels}{sep}le="{le}"}}',
             "values": _cumulative([RATE * (1 - b) for b in bad])},
            {"series": f'{name}_bucket{{{labels}{sep}le="{below}"}}',
             "values": _cumulative([0.0 for _ in bad])},
            {"series": f'{name}_bucket{{{labels}{sep}le="+Inf"}}',
             "values": _cumulative([RATE for _ in bad])},
        ]
    return series


def _retrieval(bad: list[float]) -> list[dict[str, str]]:
    # the ingest route is all slow and must not count against the retrieve route's SLO
    h = "scalelab_retrieval_request_seconds"
    return [*_histogram(h, 'route="retrieve"', "0.02", "0.01")(bad),
            {"series": f'{h}_count{{route="ingest"}}', "values": _cumulative([RATE for _ in bad])},
            {"series": f'{h}_bucket{{route="ingest",le="0.02"}}',
             "values": _cumulative([0.0 for _ in bad])}]


# The packaged objectives: serve p95 ≤ 50 ms and availability ≥ 99.9%, llm TTFT p95 ≤ 2 s (read
# at the 1 s bucket), retrieval p99 ≤ 20 ms.
CASES = [
    Case("serve_availability", "ScalelabServeAvailabilityErrorBudgetBurn", 0.001,
         {"model": "flights", "slo": "serve_availability", "stage": "serve"},
         _serve_availability),
    Case("serve_latency", "ScalelabServeLatencyErrorBudgetBurn", 0.05,
         {"model": "flights", "slo": "serve_latency", "stage": "serve"},
         _histogram("scalelab_request_duration_seconds", 'model="flights",version="1"',
                    "0.05", "0.025")),
    Case("llm_ttft", "ScalelabLlmTtftErrorBudgetBurn", 0.05,
         {"model_name": "tiny", "slo": "llm_ttft", "stage": "llm"},
         _histogram("vllm:time_to_first_token_seconds", 'model_name="tiny"', "1.0", "0.5")),
    Case("retrieval_latency", "ScalelabRetrievalLatencyErrorBudgetBurn", 0.01,
         {"slo": "retrieval_latency", "stage": "retrieval"}, _retrieval),
]

# (name, bad share of each minute as a multiple of the budget, eval time, page fires, ticket fires)
SCENARIOS: list[tuple[str, list[float], str, bool, bool]] = [
    ("within budget", [0.5] * 70, "70m", False, False),
    ("steady 3x burn", [3.0] * 70, "70m", False, True),
    ("fast 16x burn", [16.0] * 70, "70m", True, True),
    ("fast burn, stopped 40 min ago", [16.0] * 60 + [0.0] * 40, "100m", False, True),
    ("fast burn, still going", [16.0] * 60 + [0.0] * 40, "60m", True, True),
    # Each page window alone: 16x for 70 min after a quiet 6 h is 3.1x over 6 h (under that
    # window's 6x), so only the 1 h window's 14.4x pages; 10x for 7 h is under 14.4x over 1 h,
    # so only the 6 h window's 6x pages. (Above, a burn that began with the series reads the
    # same over both windows, and either window alone would page.)
    ("fast 16x burn after a quiet 6 h", [0.0] * 360 + [16.0] * 70, "430m", True, True),
    ("steady 10x burn", [10.0] * 420, "420m", True, True),
    ("steady 5x burn", [5.0] * 420, "420m", False, True),
]


def _annotations(rules: dict[str, Any]) -> dict[str, dict[str, str]]:
    # The SLO alerts' annotations are static text (no templates); promtool compares them
    # whole, so they are taken from the file. What this test decides is which alerts fire
    # with which labels.
    return {r["alert"]: r.get("annotations", {}) for g in rules["groups"] for r in g["rules"]
            if "alert" in r}


def _slo_tests(case: Case, notes: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for name, multiples, at, page, ticket in SCENARIOS:
        bad = [m * case.budget for m in multiples]
        checks = []
        for severity, fires in (("page", page), ("ticket", ticket)):
            alert = f"{case.alert}{severity.capitalize()}"
            expected = [{"exp_labels": {**case.labels, "severity": severity},
                         "exp_annotations": notes[alert]}] if fires else []
            checks.append({"eval_time": at, "alertname": alert, "exp_alerts": expected})
        out.append({"name": f"{case.slo}: {name}", "interval": "1m",
                    "input_series": case.series(bad), "alert_rule_test": checks})
    return out


def _governance_test() -> dict[str, Any]:
    def budget(client: str, used: float) -> list[dict[str, str]]:
        sel = f'client="{client}",model="flights",unit="requests",period="day"'
        return [{"series": f"scalelab_budget_used{{{sel}}}", "values": f"{used:g}x10"},
                {"series": f"scalelab_budget_limit{{{sel}}}", "values": "100x10"}]

    def spent(client: str, share: str) -> dict[str, Any]:
        return {"exp_labels": {"client": client, "model": "flights", "unit": "requests",
                               "period": "day", "severity": "ticket"},
                "exp_annotations": {"summary": f"{client} has spent {share} of its day "
                                               "budget on flights"}}

    return {"name": "governance", "interval": "1m", "input_series": [
        *budget("calm", 50), *budget("near", 95), *budget("gone", 100),
        {"series": 'scalelab_governance_stopped{kind="client",name="near"}', "values": "0x10"},
        {"series": 'scalelab_governance_stopped{kind="model",name="flights"}', "values": "1x10"},
    ], "alert_rule_test": [
        {"eval_time": "5m", "alertname": "ScalelabBudgetExhausted", "exp_alerts": [
            {"exp_labels": {"client": "gone", "model": "flights", "unit": "requests",
                            "period": "day", "severity": "page"},
             "exp_annotations": {"summary": "gone spent its day budget of requests on flights: "
                                            "requests are being shed"}}]},
        {"eval_time": "5m", "alertname": "ScalelabBudgetNearlySpent",
         "exp_alerts": [spent("near", "95%"), spent("gone", "100%")]},
        {"eval_time": "5m", "alertname": "ScalelabKillSwitchEngaged", "exp_alerts": [
            {"exp_labels": {"kind": "model", "name": "flights", "severity": "ticket"},
             "exp_annotations": {"summary": "the kill switch holds model flights: release it "
                                            "when the cause is fixed"}}]},
    ]}


def _deploy(out: Path, *extra: str) -> dict[str, Any]:
    assert run(["deploy", "grafana", "--out", str(out), *extra]) == 0
    rules: dict[str, Any] = yaml.safe_load((out / "rules.yaml").read_text("utf-8"))
    return rules


def test_every_alert_fires_when_it_must_and_only_then(tmp_path: Path) -> None:
    tool = promtool()
    rules = _deploy(tmp_path)
    notes = _annotations(rules)
    tests = [t for c in CASES for t in _slo_tests(c, notes)] + [_governance_test()]
    checked = {c["alertname"] for t in tests for c in t["alert_rule_test"]}
    # every alert of the file has a case here, and each fires in one and not in another
    assert checked == set(notes)
    # each burn alert fires in one scenario and stays silent in another (governance's hold a
    # firing and a silent series in one evaluation: "calm" and the released kill switch)
    burns = [a for a in notes if "ErrorBudgetBurn" in a]
    assert len(burns) == 2 * len(CASES)
    for alert in burns:
        outcomes = {bool(c["exp_alerts"]) for t in tests for c in t["alert_rule_test"]
                    if c["alertname"] == alert}
        assert outcomes == {True, False}, alert
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "5m",
                                    "tests": tests}, allow_unicode=True), "utf-8")
    done = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_reports_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    """The harness itself can fail: a page expected within budget is reported."""
    tool = promtool()
    rules = _deploy(tmp_path)
    notes = _annotations(rules)
    case = CASES[0]
    wrong = {"name": "wrong", "interval": "1m", "input_series": case.series([0.5e-3] * 70),
             "alert_rule_test": [{"eval_time": "70m", "alertname": f"{case.alert}Page",
                                  "exp_alerts": [{"exp_labels": {**case.labels,
                                                                 "severity": "page"},
                                                  "exp_annotations":
                                                      notes[f"{case.alert}Page"]}]}]}
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [wrong]},
                                   allow_unicode=True), "utf-8")
    done = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ScalelabServeAvailabilityErrorBudgetBurnPage" in done.stdout + done.stderr


def test_the_objectives_file_sets_the_budgets_the_alerts_burn(tmp_path: Path) -> None:
    """Serve at availability >= 99% and p99 <= 200 ms: budgets of 1%, the latency read at the
    0.2 s bucket. A steady 3% of failures opens a ticket and does not page, where the default
    99.9% objective (30x its budget) would page."""
    tool = promtool()
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(yaml.safe_dump({"stages": {"serve": {"objectives": [
        {"metric": "p99_ms", "max": 200}, {"metric": "availability", "min": 0.99}]}}}))
    rules = _deploy(tmp_path, "--slo-file", str(objectives))
    notes = _annotations(rules)
    cases = [
        Case("serve_availability", "ScalelabServeAvailabilityErrorBudgetBurn", 0.01,
             {"model": "flights", "slo": "serve_availability", "stage": "serve"},
             _serve_availability),
        Case("serve_latency", "ScalelabServeLatencyErrorBudgetBurn", 0.01,
             {"model": "flights", "slo": "serve_latency", "stage": "serve"},
             _histogram("scalelab_request_duration_seconds", 'model="flights",version="1"',
                        "0.2", "0.1")),
    ]
    tests = [t for c in cases for t in _slo_tests(c, notes)]
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "5m",
                                    "tests": tests}, allow_unicode=True), "utf-8")
    done = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
