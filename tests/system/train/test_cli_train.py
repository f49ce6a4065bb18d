"""The `scalelab train` commands through the CLI entry point (real torchrun processes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records

from .conftest import LIMIT


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out = capsys.readouterr().out
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("args, match", [
    (["--limit", "-5"], "--limit must be > 0"),
    (["--limit", "abc"], "--limit 'abc' is not a number"),
    (["--nproc", "0"], "--nproc must be >= 1"),
    (["--checkpoint-interval", "often"], "give a step count"),
    (["--rehearse-failure"], "--max-restarts >= 1"),
    (["--batch", "3", "--nproc", "2"], "does not split evenly"),
    (["--timeout", "soon"], "not a duration"),
    (["--mode", "sideways"], "Invalid value for '--mode'"),
    (["--hidden", "64,x"], "--hidden"),
    (["--data", "/nonexistent/dir"], "does not exist"),
])
def test_bad_flags_exit_2_with_one_line(args: list[str], match: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["train", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert match in " ".join(err.split())
    assert "Traceback" not in err


def test_bench_and_scaling_law_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["train", "bench", "--nproc", "2,4"]) == 2
    assert "must include 1" in capsys.readouterr().err
    assert run(["train", "scaling-law", "--widths", "8", "--data", "0.5,1"]) == 2
    assert ">= 6 grid points" in capsys.readouterr().err
    assert run(["train", "scaling-law", "--data", "0,2"]) == 2


def test_rehearsed_failure_recovers_to_the_uninterrupted_weights(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["train", "--nproc", "2", "--limit", str(LIMIT), "--batch", "128",
              "--base-batch", "128", "--steps", "16", "--hidden", "16",
              "--checkpoint-interval", "4", "--rehearse-failure", "--max-restarts", "1",
              "--timeout", "5m", "--json"])
    assert rc == 0
    out = _json(capsys)
    summary, rehearsal = out["summary"], out["rehearsal"]
    assert rehearsal["bitwise_equal"] is True and rehearsal["max_abs_diff"] == 0.0
    rec = summary["recovery"]
    assert rec["failed_step"] > rec["resumed_from_step"] >= 4
    assert rec["resumed_from_step"] % 4 == 0
    assert rec["redone_steps"] == rec["failed_step"] - rec["resumed_from_step"]
    assert rec["recovery_s"] > 0
    assert [s for s, _ in summary["loss_curve"]] == list(range(16))
    assert summary["final_loss"] == pytest.approx(rehearsal["reference_final_loss"], abs=0)


def test_bench_writes_valid_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "r.jsonl"
    rc = run(["train", "bench", "--nproc", "1,2", "--batch", "64", "--steps", "6",
              "--limit", str(LIMIT), "--hidden", "16", "--records", str(records),
              "--price-per-core-hour", "0.048", "--json"])
    assert rc == 0
    out = _json(capsys)
    recs = read_records(records)
    assert [(r.stage, r.variable, r.level) for r in recs] == [("train", "workers", 1.0),
                                                              ("train", "workers", 2.0)]
    assert recs[0].extras["efficiency"] == pytest.approx(1.0)
    assert recs[1].extras["karp_flatt"] is not None
    # Measured signals, not labels: the torchrun tree's CPU time over wall time, and the cost
    # of exactly those CPU-seconds at the core price (per run and per million samples).
    for r in recs:
        assert r.rate and r.rate > 0 and r.limiting_resource is None
        cpu, busy = r.extras["cpu_s"], r.resources.cpu_busy_cores
        assert cpu > 0 and busy > 0
        assert r.cost is not None and r.cost.usd == pytest.approx(cpu / 3600 * 0.048, rel=1e-12)
        assert r.extras["cost_per_run_usd"] == r.cost.usd
        assert r.cost.per_unit_usd == pytest.approx(r.cost.usd / r.input_volume * 1e6, rel=1e-12)
    sweep = out["sweeps"][0]  # type: ignore[index]
    assert [lv["nproc"] for lv in sweep["levels"]] == [1, 2]
    assert sweep["usl"] is None  # two levels: too few for a USL fit


def test_scaling_law_fits_and_plans(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["train", "scaling-law", "--widths", "4,8", "--data", "0.25,0.5,1",
              "--limit", "2000", "--batch", "64", "--budget", "1e10", "--threads", "1",
              "--json"])
    assert rc == 0
    out = _json(capsys)
    points = out["points"]
    assert len(points) == 6
    assert all(p["samples"] <= 2000 and p["flops_6nd"] == 6 * p["n_params"] * p["samples"]
               for p in points)
    # Whatever six tiny runs measure, the reported fit is a fit of the reported points: its
    # residual recomputed here from its own parameters (L = E + A/N^alpha + B/D^beta, RMS of
    # the log residuals), exponents at 0 named as at their bound, and a plan exactly when the
    # law has a compute-optimal split (A, B, alpha, beta > 0), spending the budget (6 N D = C)
    # at the law's loss, the best measured point the affordable one of lowest loss. (The fit
    # itself is checked on a known law in test_bench.py.)
    fit = out["fit"]
    assert fit is not None, out["fit_error"]

    def law(n: float, d: float) -> float:
        return float(fit["E"] + fit["A"] / n ** fit["alpha"] + fit["B"] / d ** fit["beta"])

    logs = [math.log(law(p["n_params"], p["samples"])) - math.log(p["test_loss"])
            for p in points]
    assert fit["rms_log_residual"] == pytest.approx(
        math.sqrt(sum(x * x for x in logs) / len(logs)), rel=1e-9, abs=1e-12)
    assert {k for k in ("alpha", "beta") if fit[k] == 0} <= set(fit["at_bounds"])
    splits = all(fit[k] > 0 for k in ("A", "B", "alpha", "beta"))
    assert (out["plan"] is not None) == splits == (out["fit_error"] is None), out["fit_error"]
    if not splits:
        assert "no compute-optimal" in out["fit_error"]
    else:
        plan = out["plan"]
        assert plan["budget_flops"] == 1e10
        assert 6 * plan["n_opt"] * plan["d_opt"] == pytest.approx(1e10, rel=1e-6)
        assert plan["predicted_loss"] == pytest.approx(law(plan["n_opt"], plan["d_opt"]))
        affordable = [p for p in points if p["flops_6nd"] <= 1e10]
        assert plan["best_measured"]["test_loss"] == min(p["test_loss"] for p in affordable)
        assert out["plan"]["n_opt"] == pytest.approx(plan.n_opt)
    assert set(out["curves"]) == {"loss_vs_data", "loss_vs_params", "loss_vs_flops"}


def test_a_stopped_bench_keeps_the_worker_counts_it_measured(tmp_path: Path) -> None:
    """Each worker count's record is appended as soon as it is measured: a bench stopped
    after the first (as diagnose stops a step at its stage's deadline: SIGTERM to its group)
    keeps that level's record, where records written at the end lost every level."""
    import subprocess
    import sys
    import time

    from scalelab.layers.web.spawn import stop_group

    records = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab", "train", "bench", "--nproc", "1,2", "--batch", "64",
         "--steps", "50", "--limit", str(LIMIT), "--hidden", "16", "--records", str(records)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Until the first level's record lands or the bench ends (bounded: the bench's 2
        # worker counts take seconds each; a bench that writes at its end ends first).
        limit = time.monotonic() + 240.0
        while (not records.exists() or not records.read_text("utf-8").strip()) \
                and proc.poll() is None and time.monotonic() < limit:
            time.sleep(0.05)
        still_running = proc.poll() is None
    finally:
        stop_group(proc, grace_s=1.0)
    assert still_running, "the bench ended before any record was written"
    recs = read_records(records)
    assert [(r.stage, r.variable, r.level) for r in recs] == [("train", "workers", 1.0)]
    assert recs[0].extras["efficiency"] == pytest.approx(1.0)
    assert recs[0].rate is not None and recs[0].rate > 0
