"""A capacity search's answer holds for `load capacity`'s 30 s confirmation run at that rate
(issue #44's "a capacity that holds"): on a server of known capacity and on the reference
`scalelab serve`. Slow (a search and at least one 30 s run each); each prints its numbers with
the load average, since the machine running it is shared."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scalelab.cli import run

pytestmark = pytest.mark.slow

CONFIRM_S = 30.0


def _holds(doc: dict[str, Any]) -> dict[str, Any]:
    """The confirmation that holds the answer: the last one, run at the reported capacity for
    the full 30 s (measured), passed, offered, at steady state."""
    conf = [s for s in doc["steps"] if s["confirmation"]]
    assert conf, doc["answer"]
    last = conf[-1]
    assert doc["confirmed_rps"] == doc["capacity_rps"] == last["rate"], doc["answer"]
    assert last["verdict"] in ("pass", "undecided-pass") and last["valid"]
    assert last["steady"]["rate_held"] and not last["steady"]["trending"]
    assert last["wall_s"] >= CONFIRM_S * 0.99
    return last


def _report(what: str, doc: dict[str, Any], last: dict[str, Any]) -> None:
    load = Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") \
        else ["?"]
    print(f"\n{what}: {doc['answer']}; search steps "
          f"{sum(not s['confirmation'] for s in doc['steps'])}, confirmations "
          f"{sum(s['confirmation'] for s in doc['steps'])}; confirmation p95 "
          f"{last['quantile_ms']:.3g} ms, served {last['throughput_rps']:.4g} req/s; "
          f"load average {' '.join(load)} (shared machine)")


def test_a_known_capacity_holds_its_confirmation(
        server: Callable[..., str], capsys: pytest.CaptureFixture[str],
        realtime_ok: bool) -> None:
    # One FIFO server, 10 ms a request (a serial section on a virtual clock, as the LoadGen
    # benchmark's): capacity exactly 100 req/s; with constant arrivals no queue below it, a
    # queue growing (rate/100 - 1) s per s above it. Generator and server in SCHED_FIFO where
    # allowed (see test_cli_load's known-capacity search).
    url = server("queue", "--service-ms", "10", realtime=realtime_ok)
    rc = run(["load", "capacity", url, "--slo", "p95<60ms", "--arrival", "constant",
              "--start", "50", "--precision", "4%", "--min-step", "2s", "--max-step", "4s",
              "--warmup", "0.3s", "--json", *(["--realtime"] if realtime_ok else [])])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["answer"]
    last = _holds(doc)
    # The answer is the truth within the search's precision, twice over where a confirmation
    # failed (the search below goes 8% under it): never above the known 100 req/s by more than
    # a rate whose queue grows too slowly to cross 60 ms in a step.
    assert 92.0 <= doc["confirmed_rps"] <= 102.5
    assert last["throughput_rps"] == pytest.approx(doc["confirmed_rps"], rel=0.02)
    with capsys.disabled():
        _report("known capacity 100 req/s", doc, last)


@pytest.fixture
def reference_server(tmp_path: Path) -> Iterator[str]:
    # The serve suite's fixtures: a flights model on the project's reference server.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "system" / "serve"))
    from serve_fixtures import add_model, start_server

    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1})
    srv = start_server(repo, tmp_path / "server.log")
    try:
        yield srv.url
    finally:
        srv.stop()


def test_the_reference_servers_capacity_holds_its_confirmation(
        reference_server: str, capsys: pytest.CaptureFixture[str], realtime_ok: bool) -> None:
    # The generator in SCHED_FIFO where allowed: on a loaded machine a normal one cannot keep
    # even 100 req/s punctual, and a search whose steps are invalid finds no capacity.
    rc = run(["load", "capacity", reference_server, "--payload", "oip", "--model", "flights",
              "--slo", "p95<50ms", "--start", "50", "--json",
              *(["--realtime"] if realtime_ok else [])])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, (doc["answer"], [s["extras"] for s in doc["steps"]])
    last = _holds(doc)
    assert last["error_rate"] == 0.0
    with capsys.disabled():
        _report("scalelab serve (flights, OIP)", doc, last)
