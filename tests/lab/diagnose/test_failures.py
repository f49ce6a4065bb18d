"""A step that fails fails its stage: a dead endpoint never reads as "no stage misses"."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.diagnose.failures import stage_failures
from scalelab.lab.diagnose.stages import SECTIONS
from scalelab.lab.report.verdict_text import verdict_lines
from scalelab.layers.web.spawn import free_port


def _stages(**on: str) -> str:
    """A `stages:` mapping with every registered stage off except those given."""
    return "{" + ", ".join(f"{s.name}: {on.get(s.name, '{enabled: false}')}"
                           for s in SECTIONS) + "}"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "scalelab.yaml"
    p.write_text(text)
    return p


class _Always500(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def broken_url() -> Iterator[str]:
    """A loopback server that answers every request with a 500."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Always500)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/x"
    finally:
        srv.shutdown()
        srv.server_close()


def test_dead_and_broken_endpoints_fail_their_stages_and_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broken_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "500")  # one verdict line per terminal line
    # Free ports nobody listens on: every connection is refused.
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = _write(
        tmp_path,
        f"""
repeats: 1
budget: null
stages: {_stages(
    serve=f"{{url: '{dead}/predict', levels: [1], base_rate: 5, duration: 1s}}",
    llm=f"{{url: '{dead}', levels: [1], requests: 2, quality_probe: 0}}")}
custom:
  - {{name: mine, kind: load, url: "{dead}/mine", levels: [1], base_rate: 5, duration: 1s,
      objectives: [{{metric: p95_ms, max: 50}}]}}
  - {{name: broken, kind: load, url: "{broken_url}", levels: [1, 2], base_rate: 5,
      duration: 1s}}
""",
    )
    out = tmp_path / "out"
    assert run(["diagnose", "--config", str(cfg), "--out", str(out)]) == 1
    text = capsys.readouterr().out
    # The terminal wraps long lines at its width (a console made before COLUMNS was set keeps
    # its own): read the verdict with its wrapping undone.
    flat = " ".join(text.split())
    for stage in ("serve", "llm", "mine"):
        at = flat.index(f"{stage} failed: ")
        assert "got an answer" in flat[at:at + 300], flat[at:at + 300]
    # The 500 server answered, and not one request succeeded: its load exits 1 with the
    # cause, and the availability objective every user endpoint has (99% by default) misses.
    assert ("broken failed: broken 5/s: exit 1: every request failed (5 sent): 500: the "
            "server failed every request; see its log") in flat
    assert "no stage misses its objectives" not in text.split("\n")[0]

    doc = json.loads((out / "report.json").read_text())
    assert set(doc["failed_stages"]) == {"serve", "llm", "mine", "broken"}
    # One failed step each (the broken endpoint's a level each): no capacity search follows a
    # level sweep nobody answered.
    assert sorted(f["stage"] for f in doc["failed_steps"]) == ["broken", "broken", "llm",
                                                               "mine", "serve"]
    broken = next(s for s in doc["verdict"]["stages"] if s["stage"] == "broken")
    assert broken["miss"]["objective"] == "availability ≥ 99% (default: the config names none)"
    assert (broken["miss"]["multiple"], broken["miss"]["value"]) == (1.0, 0.0)
    summary = doc["verdict"]["summary"]
    assert summary.startswith("serve failed: load " + dead)
    for stage in ("llm", "mine", "broken"):
        assert f"{stage} failed: " in summary
    md = (out / "report.md").read_text()
    # the failed step is the level's first chunk (each level its own steps: diagnose.sizing)
    assert f"**serve failed: load {dead}/predict 5/s: exit 2: error: no request to" in md
    assert ("- broken: failed: broken 5/s: exit 1: every request failed (5 sent): 500: the "
            "server failed every request; see its log") in md
    assert ("| broken | load | 1 | availability ≥ 99% (default: the config names none) | "
            "missed | 0% | 5 |") in md

    # `scalelab report` rebuilds the same failures from run.json and the records.
    assert run(["report", str(out)]) == 0
    again = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert any(ln.startswith("serve failed: ") for ln in again)


def test_failures_are_an_input_of_the_verdict_not_an_edit_of_its_text() -> None:
    sheet = [_row("b", 1, 0.0), _row("b", 10, 0.0)]
    goals = [StageGoal(stage=s, objectives=[]) for s in ("a", "b")]
    v = judge(goals, sheet, cores=2, memory_bytes=2**30,
              failures={"a": "refused", "b": "server never started", "c": "timeout"})
    assert [(s.stage, s.outcome, s.measured) for s in v.stages] == [
        ("a", "failed", False), ("b", "failed", True), ("c", "failed", False)]
    assert v.failed == {"a": "refused", "b": "server never started", "c": "timeout"}
    assert verdict_lines(v) == [
        "a failed: refused. b failed: server never started. c failed: timeout. no stage misses "
        "its objectives at the levels measured; none decided met at every level",
        "a: failed: refused", "b: failed: server never started",
        "  measured: no objectives to judge (measured only)",
        "  limiting: not measured — the stage recorded no CPU, memory, I/O, queue or "
        "communication signal",
        "  do: no resource signal was measured: record CPU time, peak memory and I/O wait of "
        "the stage (scalelab sweep measures its command's process tree) and run it again",
        "c: failed: timeout"]
    assert v.outcome == "failed"
    ok = judge(goals[1:], sheet, cores=2, memory_bytes=2**30)
    assert ok.failed == {} and ok.outcome == "met"


def _row(stage: str, multiple: float, failure_rate: float | None) -> SheetRow:
    none = dict.fromkeys(
        ("input_volume", "input_unit", "rate", "rate_min", "rate_max", "rate_unit", "wall_s",
         "p50_ms", "p95_ms", "p99_ms", "peak_memory_bytes", "cost_per_unit_usd", "cost_unit",
         "recovery", "limiting_resource"))
    return SheetRow(stage=stage, series="s", variable="rate", level=multiple, multiple=multiple,
                    repeats=1, failures=0, failure_rate=failure_rate, quality={}, **none)


def test_stage_failures_from_steps_and_from_all_failed_requests() -> None:
    info = {"failed_steps": [
        {"stage": "serve", "step": "load u", "error": "exit 2: refused"},
        {"stage": "serve", "step": "serve on", "error": "never ready"},
        {"step": "old run.json without a stage", "error": "x"},
    ]}
    sheet = [_row("all", 1, 1.0), _row("all", 2, 1.0),
             _row("some", 1, 0.0), _row("some", 2, 1.0),  # overload at 2×: a miss, not a fail
             _row("none", 1, None)]
    assert stage_failures(info, sheet) == {
        "serve": "load u: exit 2: refused (and 1 more failed step(s); see run.json)",
        "all": "every request failed at every level measured (1×, 2×)",
    }


def test_only_failed_steps_print_before_the_first_screen() -> None:
    """A step cut for lack of time is in the report's Time section (run.json's notes and
    cut_steps), not on the console ahead of the one-screen summary; a failed step is."""
    from scalelab.cli.diagnose import failed_step_lines
    from scalelab.lab.diagnose.steps import Step, StepResult

    def res(label: str, *, ok: bool, error: str | None = None,
            cut: str | None = None) -> StepResult:
        return StepResult(step=Step(stage="serve", label=label, command=None), ok=ok,
                          returncode=None, wall_s=1.0, error=error, cut=cut)

    steps = [res("serve batching=off", ok=True),
             res("serve batching=off capacity", ok=False,
                 cut="not started: 0 s of its stage's 40.2 s share were left"),
             res("llm curve", ok=False, cut="stopped at its stage's deadline after 18 s"),
             res("serve batching=on", ok=False, error="exit 1: connection refused")]
    assert failed_step_lines(steps) == [
        "step failed: serve batching=on: exit 1: connection refused"]
