"""`load run --server-pid`: one invocation over several rates meters the server around each
level on its own (CPU seconds, peak memory, responses it counted), and `--trace-at` marks the
requests of one level only (what the diagnose serve stage's one step over every level needs)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.lab.load.server_meter import ServerMeter

MiB = 2**20
SPIKE = ("import sys, time\n"
         "sys.stdin.readline()\n"
         "b = bytearray(b'x') * (150 * 2**20); print('up', flush=True); time.sleep(0.6)\n"
         "del b; print('down', flush=True); time.sleep(30)\n")


SERVERS = Path(__file__).with_name("servers.py")


@pytest.fixture
def fixed() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A tests/lab/load/servers.py server answering in 5 ms, with its process (the `server`
    fixture gives only the URL)."""
    proc = subprocess.Popen([sys.executable, str(SERVERS), "fixed", "--service-ms", "5"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        assert line.startswith("PORT "), line
        yield proc, f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_each_level_is_metered_on_its_own(fixed: tuple[subprocess.Popen[str], str],
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    proc, url = fixed
    recs = tmp_path / "load.jsonl"
    rc = run(["load", url, "--rates", "50,100", "--duration", "1s", "--warmup", "0.2s",
              "--arrival", "constant",
              "--server-pid", str(proc.pid), "--metrics-url", f"{url}/metrics",
              "--trace-sample", "1", "--trace-at", "100", "--records", str(recs), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    got = read_records(recs)
    # Constant arrivals: the measured second, the 0.2 s warm-up and the cold-start probe,
    # each counted by the server between that level's two readings and no other's.
    assert [r.extras["server_responses"] for r in got] == [50 + 10 + 1, 100 + 20 + 1]
    assert [r.extras["samples"] for r in got] == [50, 100]
    assert all(r.extras["server_cpu_s"] > 0 for r in got)
    assert all((r.resources.server_peak_rss_bytes or 0) > MiB for r in got)
    assert [lv["server"]["server_responses"] for lv in doc["levels"]] == [61, 121]
    # --trace-sample 1 at the 100/s level only: each of its measured requests, none at 50/s
    assert [lv["traced_requests"] for lv in doc["levels"]] == [0, 100]


@pytest.mark.parametrize(("args", "says"), [
    (["--server-pid", "99999999"], "--server-pid 99999999: no such process"),
    (["--metrics-url", "http://127.0.0.1:9/metrics"], "--metrics-url needs --server-pid"),
    (["--trace-sample", "0.5", "--trace-at", "75"], "--trace-at 75 is not one of the levels"),
])
def test_bad_meter_or_trace_flags_exit_2(args: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "http://127.0.0.1:9/", "--rates", "50,100", "--duration", "1s",
                *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_spike_between_the_readings_is_the_peak() -> None:
    """The level's peak memory is the tree's peak while it ran, not the larger of the two
    readings around it."""
    proc = subprocess.Popen([sys.executable, "-c", SPIKE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        # No metrics URL: nothing is counted, and no key says otherwise.
        meter = ServerMeter(pid=proc.pid)
        meter.start()  # before the spike: its reading is the idle interpreter
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "up"
        # Freed (munmap) before the level ends: the after-reading is the idle interpreter.
        assert proc.stdout.readline().strip() == "down"
        time.sleep(0.1)
        got = meter.stop()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert set(got) == {"server_cpu_s", "server_peak_rss_bytes"}
    assert got["server_peak_rss_bytes"] >= 150 * MiB
