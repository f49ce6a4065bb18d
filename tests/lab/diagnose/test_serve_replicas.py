"""The serve stage's replica sweep end to end: real server processes (1 and 2 uvicorn workers
behind one port), real capacity searches, the advice quoting them. `make test` runs the sweep
alone on a small model repository (the serve tests' flights-like model, no data or training
steps); the whole diagnosis that trains the served model first is slow (`make test-slow`). The
pure pieces are in test_serve_curve.py."""

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import Record, read_records
from stagekit import run_serve_alone, stages_yaml


def check_sweep(recs: list[Record]) -> dict[str, Record]:
    """Each count measured by its own server (N worker processes × 1 torch thread) replicating
    the batching series; the searches' records, by series."""
    swept = {r.series: r for r in recs if "server_processes" in r.extras}
    assert set(swept) == {"replicas=1 capacity", "replicas=2 capacity"}
    assert swept["replicas=1 capacity"].extras["server_processes"] == 1
    assert swept["replicas=2 capacity"].extras["server_processes"] == 2
    assert all(r.extras["torch_threads"] == 1 and r.extras["ready_s"] > 0
               and r.extras["replicated"] == "batching=on" for r in swept.values())
    for r in swept.values():
        # The verdict is the one its own counts give: a pass (decided or not) where the share of
        # answers within the objective reaches the quantile, a fail where it does not; decided
        # only where the one-sided 95% Clopper-Pearson bound (scipy's beta, not the product's
        # function) lies past it.
        from scipy.stats import beta

        k, n = r.extras["within_slo"], r.extras["successes"] + r.failures
        assert n > 0
        passes = k / n >= 0.95
        lower = beta.ppf(0.05, k, n - k + 1) if k > 0 else 0.0
        upper = beta.ppf(0.95, k + 1, n - k) if k < n else 1.0
        want = ("pass" if lower > 0.95 else "undecided-pass") if passes else \
            ("fail" if upper < 0.95 else "undecided-fail")
        assert r.extras["rate_verdict"] == want, (r.extras["rate_verdict"], k, n)
    return swept


def responses_by_worker(prom: Path) -> dict[int, float]:
    """200 responses each worker process counted, from its own multiprocess metrics file."""
    from prometheus_client.multiprocess import MultiProcessCollector

    out = {}
    for f in prom.glob("counter_*.db"):
        out[int(f.stem.rsplit("_", 1)[-1])] = sum(
            s.value for m in MultiProcessCollector.merge([str(f)], accumulate=True)
            for s in m.samples
            if s.name == "scalelab_responses_total" and s.labels["status"] == "200")
    return out


def test_two_replicas_swept_on_a_small_model(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep alone: no level series, the served model given; two capacity steps of ~1 s
    per count (230 requests at 250 req/s, what the p95 step rule needs). Both replicas of the
    second server answered, and the server's /metrics merge (`Metrics.expose`, run here on the
    files they left) counts every response of both: the per-worker files' sum and the load
    tester's own count of the 200s it got."""
    d, recs = run_serve_alone(tmp_path, "{base_rate: 250, levels: [1], batching: [], "
                              "capacity_max_steps: 2, capacity_step: 0.5s, replicas: [1, 2], "
                              "threads: false, objectives: [{metric: p95_ms, max: 50}]}")
    check_sweep(recs)
    # The search's first step (a failed confirmation may send it lower later).
    first = min((r for r in recs if r.series == "replicas=1 capacity"),
                key=lambda r: r.extras["capacity_step"])
    assert first.level == 250 and first.extras["requests_needed"] == 230
    by_worker = responses_by_worker(tmp_path / "out" / "work" / "prom-replicas=2")
    assert len(by_worker) == 2 and min(by_worker.values()) > 0
    from prometheus_client.parser import text_string_to_metric_families

    from scalelab.system.serve.metrics import Metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "out" / "work" /
                                                       "prom-replicas=2"))
    merged = sum(s.value for fam in text_string_to_metric_families(
        Metrics().expose().decode()) for s in fam.samples
        if s.name == "scalelab_responses_total" and s.labels.get("status") == "200")
    assert merged == sum(by_worker.values())
    # ... and every response the load tester counted against the two replicas, measured and
    # warm-up alike (plus the search's one cold-start probe), is in it: nothing lost or
    # double-counted in the merge.
    two = [r for r in recs if r.series == "replicas=2 capacity"]
    assert two and all(r.failures == 0 for r in two)
    sent_ok = sum(r.extras["successes"] + r.extras["warmup_requests"]
                  + (r.extras.get("cold_start_ms") is not None) for r in two)
    assert merged == sent_ok, (merged, sent_ok)
    assert d.verdict is not None
    serve = next(s for s in d.verdict.stages if s.stage == "serve")
    assert "replicas of batching=on measured at the objective (1 torch thread each): 1 → " \
        in serve.predicted


@pytest.mark.slow
def test_replica_sweep_measures_each_count(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    on = {
        "data": "{levels: [1], sample_rows: 2000}",
        "train": "{workers: [1], steps: 5, limit_rows: 5000, objectives: []}",
        "serve": "{base_rate: 40, levels: [1], duration: 1s, batching: ['on'], "
                 "capacity_max_steps: 2, capacity_step: 1s, replicas: [1, 2], threads: false, "
                 "objectives: [{metric: p95_ms, max: 50}]}",
    }
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml(on))
    out = tmp_path / "out"
    assert run(["diagnose", "--quick", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed_steps"] == []
    recs = [r for r in read_records(out / "records.jsonl") if r.stage == "serve"]
    check_sweep(recs)
    # Sized by the rule: the first step (40 req/s) could reach the 230 requests p95 needs.
    # The search's first step (a failed confirmation may send it lower later).
    first = min((r for r in recs if r.series == "replicas=1 capacity"),
                key=lambda r: r.extras["capacity_step"])
    assert first.extras["requests_needed"] == 230 and (first.input_volume or 0) >= 230
    serve = next(s for s in doc["verdict"]["stages"] if s["stage"] == "serve")
    assert "replicas of batching=on measured at the objective (1 torch thread each): 1 → " \
        in serve["predicted"]
