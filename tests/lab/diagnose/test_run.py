"""`scalelab diagnose` end to end: real subprocesses, real records, the report, the verdict."""

import json
import sys
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records

OFF = "{enabled: false}"


def _stages(**on: str) -> str:
    """A `stages:` mapping with every registered stage off except those given (YAML flow
    text per stage): tests stay about the stages they name as stages are added."""
    from scalelab.lab.diagnose.stages import SECTIONS

    body = ", ".join(f"{s.name}: {on.get(s.name, OFF)}" for s in SECTIONS)
    return "{" + body + "}"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "scalelab.yaml"
    p.write_text(text)
    return p


def test_users_own_sweep_stage_with_a_serial_phase_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two user stages that report their own throughput (so the test does not depend on this
    # machine's timing): one scales perfectly, one has a serial fraction of 0.5 (Amdahl).
    job = tmp_path / "job.py"
    job.write_text(
        "import json, sys\n"
        "n = int(sys.argv[1]); s = float(sys.argv[2])\n"
        "print(json.dumps({'rate': 100.0 / (s + (1 - s) / n)}))\n"
    )
    cfg = _write(
        tmp_path,
        f"""
repeats: 1
stages: {_stages()}
custom:
  - name: parallel
    kind: sweep
    var: workers
    levels: [1, 2, 4]
    command: ["{sys.executable}", "{job}", "{{workers}}", "0"]
    metric: "json:rate"
    objectives: [{{metric: efficiency, min: 0.7}}]
  - name: serialjob
    kind: sweep
    var: workers
    levels: [1, 2]
    command: ["{sys.executable}", "{job}", "{{workers}}", "0.5"]
    metric: "json:rate"
    objectives: [{{metric: efficiency, min: 0.7}}]
""",
    )
    out = tmp_path / "out"
    assert run(["diagnose", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # The report is built once: --json prints exactly the report.json that was written.
    assert doc == json.loads((out / "report.json").read_text())
    v = doc["verdict"]
    assert v["first"] == "serialjob"
    stages = {s["stage"]: s for s in v["stages"]}
    assert stages["parallel"]["miss"] is None
    miss = stages["serialjob"]["miss"]
    assert miss["multiple"] == 2.0 and miss["metric"] == "efficiency"
    # Amdahl with s = 0.5: Karp–Flatt e = 0.5 at every level, and the evidence cites it.
    lim = stages["serialjob"]["limiting"][0]
    assert lim["resource"] == "serial fraction"
    assert "e=0.50 at 2" in lim["evidence"]
    recs = read_records(out / "records.jsonl")
    assert {r.stage for r in recs} == {"parallel", "serialjob"} and len(recs) == 5
    assert (out / "report.html").read_text().count("<svg") >= 2

    # `scalelab report` rebuilds the same verdict from the stored records.
    (out / "report.html").unlink()
    assert run(["report", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["verdict"]["summary"] == v["summary"]
    assert (out / "report.html").exists()
    # The gate: serialjob missed its objective, so CI fails on it.
    assert run(["report", str(out), "--json", "--fail-on", "miss"]) == 1
    assert "gate failed (--fail-on miss): serialjob misses efficiency ≥ 0.7 at 2×" in (
        capsys.readouterr().err)


def test_reference_system_quick_names_the_throttled_serving_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Small data everywhere; the served model sleeps 40 ms per forward call (a serial section:
    # at most 25 requests/s without batching), so at 10× = 40 requests/s serving must break,
    # while 4 requests/s stays far inside p95 ≤ 150 ms.
    cfg = _write(
        tmp_path,
        "repeats: 1\nstages: "
        + _stages(
            data="{levels: [1, 2], sample_rows: 2000}",
            train="{workers: [1], steps: 5, limit_rows: 5000, objectives: []}",
            serve="{base_rate: 4, levels: [1, 10], duration: 2s, batching: ['off'], "
            "serial_ms: 40, capacity: false, "
            "objectives: [{metric: p95_ms, max: 150}]}",
            model="{variants: [int8], "
            "objectives: [{metric: 'quality:macro_f1_delta_points', min: -100}]}",
        )
        + "\n",
    )
    out = tmp_path / "out"
    assert run(["diagnose", "--quick", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed_steps"] == []
    stages = {s["stage"]: s for s in doc["verdict"]["stages"]}
    assert set(stages) == {"data", "train", "serve", "model"}
    assert all(s["measured"] for s in stages.values())
    assert doc["verdict"]["first"] == "serve"
    assert stages["serve"]["miss"]["multiple"] == 10.0
    # Every limiting line cites a measurement; the sheet's cost cells are filled.
    for s in stages.values():
        assert s["limiting"] and all(e["evidence"] for e in s["limiting"])
    assert all(row["cost_per_unit_usd"] is not None for row in doc["sheet"]
               if row["stage"] in ("data", "train", "model")
               or row["series"] == "batching=off")
    recs = read_records(out / "records.jsonl")
    assert {r.stage for r in recs} == {"data", "train", "serve", "model"}
    assert all(r.experiment == doc["experiment"] for r in recs)
    serve = [r for r in recs if r.stage == "serve"]
    assert {r.series for r in serve} == {"batching=off"}
    html = (out / "report.html").read_text()
    assert "serve misses first" in html and html.count("<svg") >= 3
    md = (out / "report.md").read_text()
    assert md.startswith("# scalelab diagnosis") and "| serve | batching=off |" in md


def test_ctrl_c_stops_the_step_and_keeps_the_report(tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    import psutil

    marker = f"scalelab-test-sleeper-{tmp_path.name}"
    cfg = _write(
        tmp_path,
        f"""
repeats: 1
stages: {_stages()}
custom:
  - name: sleeper
    kind: sweep
    var: n
    levels: [1, 2]
    command: ["{sys.executable}", "-c", "import time; time.sleep(60)", "{marker}", "{{n}}"]
""",
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab", "diagnose", "--config", str(cfg), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def sleepers() -> list[psutil.Process]:
        # the sweep's command itself (`python -c ...`), not the `scalelab sweep` step whose
        # argv holds the marker and "-c" too (`python -m scalelab sweep ... -- python -c ...`),
        # nor a child the step forked and has not yet exec'd (its argv is the step's): the step
        # must stop what it started, so Ctrl-C goes only once the command runs
        found = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if marker in cmd and cmd[1:2] == ["-c"]:
                found.append(p)
        return found

    deadline = time.monotonic() + 60
    while not sleepers():
        assert proc.poll() is None and time.monotonic() < deadline, "the step never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    # A hang guard, not a speed check: writing the report on a loaded machine takes a while.
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert b"interrupted" in err
    assert (out / "report.html").exists() and (out / "records.jsonl").exists()
    deadline = time.monotonic() + 10
    while sleepers():
        assert time.monotonic() < deadline, "the interrupted step's process survived"
        time.sleep(0.1)
