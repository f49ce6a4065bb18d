"""The Grafana dashboard and the Prometheus rules: the dashboard model's schema, every
expression parsed (by promtool, and by the project's parser), the burn-rate
windows, and the metric names against what the servers really expose."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalelab.cli import run
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.observe.catalog import METRICS, metric_of, series_names
from scalelab.layers.observe.dashboards import dashboard, metrics_used
from scalelab.layers.observe.promql import metric_names, parse
from scalelab.layers.observe.rules import (
    latency_slo,
    le_matcher,
    read_objectives,
    recorded_names,
    rules_document,
    slos_from_objectives,
)
from scalelab.system.serve.app import create_app
from scalelab.system.serve.settings import ServerSettings

for helpers in ("system/serve", "layers/web"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / helpers))

from inproc import serving  # noqa: E402
from serve_fixtures import add_model, infer_body  # noqa: E402

from promtool_bin import promtool  # noqa: E402

KEY = "sk-metered-0123456789"



def sdk_round_trip(board: dict[str, Any]) -> dict[str, Any]:
    """The board decoded into grafana-foundation-sdk's typed models (Dashboard, RowPanel,
    Panel, the timeseries options and the Prometheus query, by their plugins) and encoded
    again: a key the models do not know is dropped on the way."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    out: dict[str, Any] = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    return out


def unknown_keys(emitted: Any, typed: Any, path: str = "") -> list[str]:
    """Paths in `emitted` that the typed round trip lost or changed (it may add defaults)."""
    if isinstance(emitted, dict) and isinstance(typed, dict):
        return [bad for k, v in emitted.items() for bad in
                ([f"{path}/{k}"] if k not in typed else unknown_keys(v, typed[k], f"{path}/{k}"))]
    if isinstance(emitted, list) and isinstance(typed, list) and len(emitted) == len(typed):
        return [bad for i, (a, b) in enumerate(zip(emitted, typed, strict=True))
                for bad in unknown_keys(a, b, f"{path}[{i}]")]
    return [] if emitted == typed else [path]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("grafana")
    assert run(["deploy", "grafana", "--out", str(out), "--datasource", "prom-main"]) == 0
    board = json.loads((out / "dashboard.json").read_text("utf-8"))
    rules = yaml.safe_load((out / "rules.yaml").read_text("utf-8"))
    return board, rules


def test_dashboard_is_grafanas_typed_model_and_tiles_without_overlap(
        written: tuple[dict[str, Any], dict[str, Any]]) -> None:
    from grafana_foundation_sdk.models.dashboard import Dashboard

    board, _ = written
    assert unknown_keys(board, sdk_round_trip(board)) == []
    assert board["schemaVersion"] == Dashboard().schema_version == 41
    assert {p["type"] for p in board["panels"]} == {"row", "timeseries"}
    assert all(p["targets"] for p in board["panels"] if p["type"] != "row")
    misspelt = json.loads(json.dumps(board))
    misspelt["panels"][1]["options"]["legend"]["placment"] = "bottom"
    misspelt["panels"][2]["targets"][0]["legend"] = "p50"
    assert unknown_keys(misspelt, sdk_round_trip(misspelt)) == [
        "/panels[1]/options/legend/placment", "/panels[2]/targets[0]/legend"]
    assert board["templating"]["list"][0]["current"]["value"] == "prom-main"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        here = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & here, p["title"]
        cells |= here


def test_every_panel_the_issue_asks_for_is_there(
        written: tuple[dict[str, Any], dict[str, Any]]) -> None:
    board, _ = written
    exprs = "\n".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le, model) (rate(" \
               "scalelab_request_duration_seconds_bucket[$__rate_interval])))" in exprs
    for name in ("scalelab_queue_depth", "scalelab_batch_size_bucket",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_hits_total", "scalelab_retrieval_request_seconds_bucket",
                 "scalelab:budget_used:ratio", "scalelab_governance_refusals_total",
                 "scalelab:slo_serve_availability_errors:ratio_rate1h"):
        assert name in exprs, name


def test_every_expression_parses_and_reads_only_known_series(
        written: tuple[dict[str, Any], dict[str, Any]]) -> None:
    board, rules = written
    recorded = recorded_names(rules)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for e in exprs:
        assert parse(e).type == "vector", e
        for name in metric_names(e):
            assert name in recorded or metric_of(name) is not None, (name, e)


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    tool = promtool()
    out = tmp_path / "g"
    assert run(["deploy", "grafana", "--out", str(out)]) == 0
    done = subprocess.run([tool, "check", "rules", str(out / "rules.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # 4 SLOs (serve latency and availability, llm TTFT, retrieval latency) x (5 windows + 2
    # alerts), and governance's ratio and 3 alerts
    assert "SUCCESS: 32 rules found" in done.stdout
    # promtool parses the dashboard's expressions too, as recording rules (Grafana substitutes
    # $__rate_interval before Prometheus sees a query)
    board = json.loads((out / "dashboard.json").read_text("utf-8"))
    exprs = [t["expr"].replace("$__rate_interval", "5m")
             for p in board["panels"] for t in p.get("targets", [])]
    panels = tmp_path / "panels.yaml"
    panels.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": [
        {"record": f"panel:expr_{i}:check", "expr": e} for i, e in enumerate(exprs)]}]}))
    done = subprocess.run([tool, "check", "rules", str(panels)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


REFUSED = ["rate(x_total)", "sum(rate(x[5m])", "x[5m] / 2", "histogram_quantile(x, y)",
           "nosuchfn(x)", 'x{le=5}', 'x{le=~"("}', "sum by (le) (x[5m])", "x and 1", ""]


@pytest.mark.parametrize("bad", REFUSED)
def test_the_parser_refuses_what_prometheus_refuses(bad: str) -> None:
    with pytest.raises(BadInputError):
        parse(bad)


def test_label_lists_in_grouping_and_matchers() -> None:
    assert parse("sum by (a, b,) (x)").metrics == {"x"}
    assert parse('x{a="1",b!~"c.*",}').metrics == {"x"}
    for bad, says in [("sum by (1a) (x)", "'1' is not a label name"),
                      ('x{1a="1"}', "'1' is not a label name"),
                      ("x{a 1}", r"expected a matcher \(=, !=, =~, !~\) \(at '1'\)")]:
        with pytest.raises(BadInputError, match=says):
            parse(bad)


def test_prometheus_refuses_each_of_them_too(tmp_path: Path) -> None:
    tool = promtool()
    for i, bad in enumerate(REFUSED):
        f = tmp_path / f"bad{i}.yaml"
        f.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
            {"record": "bad:expr:check", "expr": bad}]}]}))
        done = subprocess.run([tool, "check", "rules", str(f)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1, bad


def test_each_slo_records_the_windows_its_alerts_read(
        written: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # the record names are what the dashboard's panels read; whether the alerts over them fire
    # when they must is promtool's test in test_alert_rules.py
    _, rules = written
    group = next(g for g in rules["groups"] if g["name"] == "scalelab-slo-serve_availability")
    records = [r["record"] for r in group["rules"] if "record" in r]
    assert records == [f"scalelab:slo_serve_availability_errors:ratio_rate{w}"
                       for w in ("5m", "30m", "1h", "6h", "3d")]


def test_latency_slo_is_the_share_above_a_bucket_boundary() -> None:
    slo = latency_slo("serve", {"metric": "p95_ms", "max": 50})
    assert (slo.target, slo.boundary_s) == (0.95, 0.05)
    assert slo.budget == pytest.approx(0.05, abs=1e-15)
    assert 'le="0.05"' in slo.bad
    # 2 s is no TTFT bucket boundary: read at the largest below it (1.0), stricter
    ttft = latency_slo("llm", {"metric": "p95_ms", "max": 2000})
    assert ttft.boundary_s == 1.0
    assert 'le=~"1|1.0"' in ttft.bad
    assert le_matcher(10.0) == 'le=~"10|10.0"'
    with pytest.raises(BadInputError, match="smallest bucket"):
        latency_slo("serve", {"metric": "p99_ms", "max": 0.1})


def test_slo_targets_come_from_the_objectives_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "objectives.yaml"
    f.write_text(yaml.safe_dump({"stages": {"serve": {"objectives": [
        {"metric": "p99_ms", "max": 200}, {"metric": "availability", "min": 0.99}]}}}))
    slos = {s.name: s for s in slos_from_objectives(read_objectives(f))}
    assert (slos["serve_latency"].target, slos["serve_latency"].boundary_s) == (0.99, 0.2)
    assert slos["serve_availability"].target == 0.99
    assert slos["llm_ttft"].target == 0.95  # from the defaults: the file left llm alone
    out = tmp_path / "g"
    # what the file's budgets do to the alerts is promtool's test in test_alert_rules.py
    capsys.readouterr()
    assert run(["deploy", "grafana", "--out", str(out), "--slo-file", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["panels"], doc["rules"]) == (21, 32)
    assert doc["slos"][0] == {"name": "serve_latency", "objective": "p99 ≤ 200 ms",
                              "target": 0.99, "boundary_s": 0.2}
    f.write_text("stages: [1, 2]\n")
    assert run(["deploy", "grafana", "--out", str(out), "--slo-file", str(f)]) == 2


def _exposed(text: str) -> set[str]:
    """Sample names a scrape holds: from the samples, and from each family's type (a
    labelled family with no child yet shows only its HELP and TYPE lines)."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names |= {s.name for s in fam.samples}
        if fam.type == "counter":  # the parser names a counter's family without _total
            names.add(f"{fam.name}_total")
        elif fam.type == "histogram":
            names |= {f"{fam.name}_bucket", f"{fam.name}_count", f"{fam.name}_sum"}
        else:
            names.add(fam.name)
    return names


def _les(text: str, family: str) -> list[float]:
    return sorted({float(s.labels["le"]) for fam in text_string_to_metric_families(text)
                   for s in fam.samples
                   if s.name == f"{family}_bucket" and s.labels["le"] != "+Inf"})


def test_tabular_server_exposes_every_name_the_dashboard_reads(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1}, cache={"enabled": True, "max_entries": 10, "ttl_s": 60})
    gov = tmp_path / "governance.json"
    gov.write_text(json.dumps({"governance": {"clients": {"metered": {
        "keys": [KEY], "budgets": [{"unit": "requests", "period": "day", "limit": 1}]}}}}))
    # the whole server as `scalelab serve` builds it, on uvicorn in a thread of this process
    app = create_app(ServerSettings(model_repo=repo, access_log="off",
                                    governance_file=str(gov)))
    switch = sys.getswitchinterval()
    try:
        with serving(app) as base:
            url = f"{base}/v2/models/flights/infer"
            first = httpx.post(url, json=infer_body(2), headers={"X-API-Key": KEY}, timeout=10)
            assert first.status_code == 200
            refused = httpx.post(url, json=infer_body(2), headers={"X-API-Key": KEY},
                                 timeout=10)
            assert refused.status_code == 429  # the budget of one request is spent
            text = httpx.get(f"{base}/metrics", timeout=10).text
    finally:  # the server's lifespan tunes these for a server process, not a test run
        sys.setswitchinterval(switch)
        gc.unfreeze()
    slos = slos_from_objectives(read_objectives(None))
    used = metrics_used(dashboard(slos))
    rules = rules_document(slos)
    read_by_rules: dict[str, set[str]] = {}
    for g in rules["groups"]:
        for r in g["rules"]:
            for n in metric_names(r["expr"]):
                if (m := metric_of(n)) is not None:
                    read_by_rules.setdefault(m.server, set()).add(n)
    exposed = _exposed(text)
    assert len(used["serve"]) >= 10
    assert used["serve"] <= exposed
    governance = used["governance"] | read_by_rules["governance"]
    assert governance == {"scalelab_budget_used", "scalelab_budget_limit",
                          "scalelab_governance_refusals_total", "scalelab_governance_stopped",
                          "scalelab_governance_inflight"}
    assert governance <= exposed
    assert read_by_rules["serve"] <= exposed
    # the SLO reads the boundary as the server writes it, and the catalog's buckets are real
    assert 'scalelab_request_duration_seconds_bucket{le="0.05",model="flights",version="1"}' \
           in text
    assert _les(text, "scalelab_request_duration_seconds") == \
           list(METRICS["scalelab_request_duration_seconds"].buckets)


def test_generation_and_retrieval_registries_expose_the_catalogs_names() -> None:
    from scalelab.system.generate.metrics import EngineMetrics
    from scalelab.system.retrieval.service import _Metrics

    engine = EngineMetrics("tiny")
    engine.ttft.labels("tiny").observe(0.3)
    text = generate_latest(engine.registry).decode()
    retrieval = _Metrics()
    retrieval.seconds.labels("retrieve").observe(0.003)
    rtext = generate_latest(retrieval.registry).decode()
    exposed = {"generate": _exposed(text), "retrieval": _exposed(rtext)}
    for m in METRICS.values():
        if m.server in exposed:
            assert set(series_names(m)) <= exposed[m.server], m.name
    assert _les(text, "vllm:time_to_first_token_seconds") == \
           list(METRICS["vllm:time_to_first_token_seconds"].buckets)
    assert _les(rtext, "scalelab_retrieval_request_seconds") == \
           list(METRICS["scalelab_retrieval_request_seconds"].buckets)


def test_one_prefix_for_our_own_metrics() -> None:
    # scalelab_ for ours; vllm: only where the generation server mirrors vLLM; a colon
    # elsewhere is reserved for recording rules.
    odd = [m.name for m in METRICS.values()
           if not (m.name.startswith("scalelab_")
                   or (m.server == "generate" and m.name.startswith("vllm:")))]
    assert odd == []
