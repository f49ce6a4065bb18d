"""`scalelab compare` against real servers on 127.0.0.1: a known 20% regression is worse, and
pairs drawn from one server's latencies show no difference."""

from __future__ import annotations

import csv
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from scalelab.cli import run
from scalelab.lab.compare.comparison import compare
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.load.histogram import LatencyHistogram

SERVERS = Path(__file__).parents[1] / "load" / "servers.py"


@pytest.fixture
def server() -> Iterator[Callable[..., str]]:
    """A tests/lab/load/servers.py server: "fixed" answers after exactly --service-ms."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, str(SERVERS), *args], stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        return f"http://127.0.0.1:{int(line.split()[1])}"

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _record(latencies_s: np.ndarray) -> Record:
    h = LatencyHistogram()
    h.record_us((latencies_s * 1e6).astype(np.int64))
    return make_record(experiment="x", stage="load", variable="rate", level=1.0,
                       latency=h.percentiles().latency(),
                       histograms={"latency": h.encode()}, extras={"samples": h.count})


def test_twenty_pairs_from_one_server_show_no_difference(server: Callable[..., str]) -> None:
    """The pairs are one real run's latencies (600 sequential requests to a fixed 2 ms server)
    split at random into two halves, 20 times: same server, same moment, as two runs."""
    url = server("fixed", "--service-ms", "2")
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    lat = []
    for _ in range(600):
        t0 = time.perf_counter()
        conn.request("GET", "/")
        conn.getresponse().read()
        lat.append(time.perf_counter() - t0)
    conn.close()
    x = np.asarray(lat)
    rng = np.random.default_rng(7)
    differ = 0
    slower = 0
    for _ in range(20):
        perm = rng.permutation(len(x))
        a, b = x[perm[:300]], x[perm[300:]]
        c = compare([_record(a)], [_record(b)])
        differ += any(r.decision in ("better", "worse") for r in c.rows)
        # Not vacuous: the same halves with B 20% slower are told apart.
        c = compare([_record(a)], [_record(b * 1.2)])
        slower += next(r for r in c.rows if r.metric == "latency p50").decision == "worse"
    assert differ <= 1
    assert slower >= 19


def test_a_20_percent_slower_server_is_worse_and_fails_the_gate(
        server: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two real `scalelab load` runs: a server answering in 10 ms, then one in 12 ms."""
    paths = []
    for ms in ("10", "12"):
        url = server("fixed", "--service-ms", ms)
        p = tmp_path / f"{ms}.jsonl"
        assert run(["load", url, "--rate", "100", "--arrival", "constant", "--duration", "1.5s",
                    "--warmup", "0.2s",
                    "--records", str(p), "--json"]) == 0
        paths.append(p)
    capsys.readouterr()
    out = tmp_path / "cmp.csv"
    rc = run(["compare", str(paths[0]), str(paths[1]), "--fail-on", "worse", "--json",
              "--output", str(out), "--markdown", str(tmp_path / "cmp.md"),
              "--html", str(tmp_path / "cmp.html"), "--plot", str(tmp_path / "cmp.png")])
    assert rc == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1
    p50 = next(r for r in doc["rows"] if r["metric"] == "latency p50")
    # Service 12 ms against 10 ms: 1.2 less the client's share, plus a busy machine's noise.
    assert p50["decision"] == "worse" and 1.05 < p50["ratio"] < 1.5
    assert p50["lower"] > 1.0 and p50["n_a"] == 150
    rows = list(csv.DictReader(out.open()))
    assert [r["metric"] for r in rows] == [r["metric"] for r in doc["rows"]]
    assert "✗ worse" in (tmp_path / "cmp.md").read_text()
    assert '<tr class="worse"><td>load rate=100</td><td>latency p50</td>' in (
        tmp_path / "cmp.html").read_text()
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    # The same two runs, B against itself: nothing worse, the gate passes.
    assert run(["compare", str(paths[1]), str(paths[1]), "--fail-on", "worse", "--json"]) == 0


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["compare", str(tmp_path / "none.jsonl"), str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "r.jsonl").write_text("")
    assert run(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "holds no records" in capsys.readouterr().err
    assert run(["compare", "a", "b", "--output", "x.txt"]) == 2
    assert run(["compare", "a", "b", "--margin", "150%"]) == 2


def test_three_repeats_a_side_compare_each_repeats_quantile() -> None:
    """Runs as the unit: three repeats a side whose p50s drift between runs by more than the
    latencies within a run would say are compared over the repeats (Welch), not merged."""
    base = np.linspace(0.010, 0.011, 400)
    a = [_record(base * f) for f in (1.00, 1.04, 0.97)]
    b = [_record(base * f) for f in (1.03, 0.98, 1.01)]
    c = compare(a, b)
    p50 = next(r for r in c.rows if r.metric == "latency p50")
    assert p50.basis == "repeats (welch t)" and p50.n_a == 3
    assert p50.decision == "undecided"
    merged = compare([_record(np.concatenate([base * f for f in (1.00, 1.04, 0.97)]))],
                     [_record(np.concatenate([base * f for f in (1.03, 0.98, 1.01)]))])
    assert next(r for r in merged.rows if r.metric == "latency p50").basis == "order statistic"
