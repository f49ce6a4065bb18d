"""Systems whose limit is known by construction, diagnosed as a user would: the stage, the
level and the limit named must be the true ones (127.0.0.1, a few seconds each; the asserts
are about what is robust on two busy cores, never a wall-clock time)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.core.records import read_records
from scalelab.diagnose.stages import SECTIONS

LLM_SERVER = Path(__file__).parents[1] / "load" / "llm_server.py"


def _config(tmp_path: Path, custom: str = "", **on: str) -> Path:
    stages = ", ".join(f"{s.name}: {on.get(s.name, '{enabled: false}')}" for s in SECTIONS)
    p = tmp_path / "scalelab.yaml"
    p.write_text(f"repeats: 1\nstages: {{{stages}}}\n" + (f"custom:\n{custom}" if custom else ""))
    return p


@pytest.fixture
def four_slots() -> Iterator[str]:
    """An OpenAI-compatible server with exactly 4 generation slots: 20 ms to the first token,
    then 10 ms a token; a fifth stream waits for a slot (FIFO)."""
    proc = subprocess.Popen([sys.executable, str(LLM_SERVER), "--max-streams", "4",
                             "--ttft-ms", "20", "--gap-ms", "10", "--diverge-at", "1000"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    try:
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_an_llm_endpoint_with_four_slots_is_limited_by_its_batch_slots(
    four_slots: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2, 4 and 8 streams: up to 4 every stream decodes at once (TTFT 20 ms); at 8 half of
    # them wait a whole 90 ms stream for a slot, so TTFT p95 ≥ 100 ms misses 60 ms at 4×.
    cfg = _config(tmp_path, llm=(
        f"{{url: '{four_slots}', base_concurrency: 2, levels: [1, 2, 4], requests: 24,"
        " output_tokens: 'fixed:8', prompt_tokens: 'fixed:8', shared_prefix: 0,"
        " quality_probe: 0, objectives: [{metric: p95_ms, max: 60}]}"))
    out = tmp_path / "out"
    assert run(["diagnose", "--config", str(cfg), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    llm = next(s for s in doc["verdict"]["stages"] if s["stage"] == "llm")
    assert doc["verdict"]["first"] == "llm" and llm["miss"]["multiple"] == 4.0
    top = [r for r in read_records(out / "records.jsonl") if r.level == 8.0]
    assert len(top) == 1 and top[0].extras["engine_running_max"] == 4
    # The limiting line names what the engine said, with its numbers, as the do line does.
    lim = llm["limiting"][0]
    assert lim["resource"] == "batch-slots", llm["limiting"]
    assert lim["evidence"].startswith("up to 4 sequences running, up to ")
    assert lim["evidence"].endswith("at concurrency=8 (the engine's /metrics)")
    assert "--max-num-seqs" in llm["intervention"]
    assert "limiting resource: batch-slots (up to 4 sequences running" in \
        doc["verdict"]["summary"]
    assert not any(e["resource"] == "not measured" for e in llm["limiting"])
