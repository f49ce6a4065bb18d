"""`diagnose` against user endpoints with a known limit (real processes on 127.0.0.1): each gets
the right limiting resource, with the number that shows it, and the right first failing level.

- a single-threaded app instrumented with prometheus_client, served by uvicorn: 8 ms of CPU per
  request on the event loop's one thread (a custom load stage);
- an app that admits 50 requests/s and answers 503 at once above it (`stages.serve.url`);
- an OpenAI-compatible server with 2 generation slots and no /metrics (`stages.llm.url`).
"""

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmkit import llm_server
from scalelab.cli import run
from stagekit import stages_yaml

APPS = Path(__file__).resolve().parents[1] / "load" / "server_apps.py"


@contextlib.contextmanager
def app(*args: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(APPS), *args], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _diagnose(tmp_path: Path, body: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(body)
    run(["diagnose", "--config", str(cfg), "--out", str(tmp_path / "out"), "--json"])
    out = capsys.readouterr()
    assert out.out, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return doc


def _stage(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in doc["verdict"]["stages"] if s["stage"] == name)


def test_a_single_threaded_endpoint_is_named_one_core_saturated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 5/s asks 4% of a core; 200/s asks 1.6 cores of a server that can use one.
    with app("cpu", "--work-ms", "8") as url:
        doc = _diagnose(tmp_path, stages_yaml({}) + f"""
budget: null
custom: [{{name: api, kind: load, url: "{url}/", base_rate: 5, levels: [1, 40], duration: 1s,
  capacity: false, objectives: [{{metric: p95_ms, max: 200}}]}}]
""", capsys)
    st = _stage(doc, "api")
    assert st["miss"]["multiple"] == 40.0
    top = st["limiting"][0]
    assert top["resource"] == "server cpu"
    assert "one core saturated, the work runs on one thread" in top["evidence"]
    assert f" of {os.cpu_count()} cores busy" in top["evidence"]
    assert "(process pid " in top["evidence"]


def test_an_endpoint_that_refuses_above_its_limit_is_named_admission(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with app("admit", "--rate", "50") as url:
        doc = _diagnose(tmp_path, stages_yaml({"serve": f"""{{url: "{url}/", base_rate: 10,
  levels: [1, 10], duration: 1s, batching: ["off"], capacity: false,
  objectives: [{{metric: availability, min: 0.99}}]}}"""}) + "budget: null\n", capsys)
    st = _stage(doc, "serve")
    assert st["miss"]["multiple"] == 10.0
    top = st["limiting"][0]
    assert top["resource"] == "admission"
    assert "refused with 503" in top["evidence"] and "at rate=100" in top["evidence"]
    assert "none refused at rate=10" in top["evidence"]


def test_an_engine_with_two_slots_and_no_metrics_is_inferred_from_the_client(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One stream: TTFT 30 ms, 16 tokens in 105 ms. Two slots: from 4 streams on, half wait.
    with llm_server("--max-streams", "2", "--ttft-ms", "30", "--gap-ms", "5",
                    "--no-metrics") as url:
        doc = _diagnose(tmp_path, stages_yaml({"llm": f"""{{url: "{url}", levels: [1, 2, 4, 8],
  requests: 16, capacity: false, quality_probe: 0, output_tokens: "fixed:16",
  prompt_tokens: "fixed:8", shared_prefix: 0,
  objectives: [{{metric: p95_ms, max: 100, label: "TTFT p95 ≤ 100 ms"}}]}}"""})
            + "budget: null\n", capsys)
    st = _stage(doc, "llm")
    assert st["miss"]["multiple"] == 4.0
    by = {e["resource"]: e["evidence"] for e in st["limiting"]}
    assert by["slots (inferred)"].startswith("about 2 slots: ")
    assert "flat past 2" in by["slots (inferred)"]
    assert "per extra stream" in by["queue (inferred)"]
