"""The streaming load generator against the deterministic SSE server (tests/lab/load/llm_server.py).

Known TTFT and gaps, chunks of several tokens: measured TTFT and e2e are at least what the
server itself did (its GET /truth, a late timer included; a client cannot see a token before it
is sent) and above it only by the client's lag, measured during the run (a starved client reads
chunks in one late burst); TPOT is a difference of two such times, within that lag either side.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from figurekit import assert_image, capture, lines
from llmkit import JITTER_MS, StallWatch, assert_within_truth, server_truth
from llmkit import llm_server as start_llm_server
from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.lab.load.clock import realtime
from scalelab.lab.load.llm.result import LlmResult
from scalelab.lab.load.llm.run import LlmPlan, run_llm
from scalelab.lab.load.llm.stream import StreamConfig
from scalelab.lab.load.llm.workload import LengthDist, UsageMode, Workload
from scalelab.lab.load.send import Target

PREC = 0.999  # HdrHistogram at 3 significant digits reads at most 0.1% low


@pytest.fixture
def llm_server() -> Iterator[Callable[..., str]]:
    with contextlib.ExitStack() as stack:
        yield lambda *args, **kw: stack.enter_context(start_llm_server(*args, **kw))


def _run(url: str, *, out: int = 12, usage: UsageMode = "continuous", mode: str = "closed",
         concurrency: int = 2, rate: float | None = None, requests: int | None = 20,
         duration_s: float | None = None, processes: int = 1) -> LlmResult:
    t = Target.parse(url + "/v1/chat/completions")
    reqs = Workload(output=LengthDist(kind="fixed", a=out), usage=usage, distinct=4).build(t)
    plan = LlmPlan(stream=StreamConfig(target=t, requests=reqs, mode=mode,  # type: ignore[arg-type]
                                       concurrency=concurrency, timeout_s=20.0),
                   rate=rate, requests=requests, duration_s=duration_s, processes=processes)
    return run_llm(plan)


def test_ttft_itl_tpot_match_a_server_sending_three_tokens_per_chunk(
        llm_server: Callable[..., str]) -> None:
    url = llm_server("--ttft-ms", "40", "--gap-ms", "12", "--tokens-per-chunk", "3")
    watch = StallWatch().start()
    r = _run(url)
    lag = JITTER_MS + watch.stop()
    assert (r.successes, r.failures, r.output_tokens) == (20, 0, 20 * 12)
    assert r.token_sources == {"usage-continuous": 20} and r.prompt_tokens == 20 * 128
    # 12 tokens = chunks of 3 due at 40, 52, 64, 76 ms; the server's timers are lower bounds.
    truth = server_truth(url)
    assert len(truth["ttft_ms"]) == 20
    assert min(truth["ttft_ms"]) >= 40 and min(truth["e2e_ms"]) >= 76
    assert_within_truth(r, truth, lag)
    assert r.itl.count == 20 * 11
    # A late chunk lengthens its gap and shortens the next: gaps have no lower bound, but they
    # sum to (last token - first token), so their mean is TPOT's (to µs rounding) ...
    assert r.itl.mean_ms is not None and r.tpot.mean_ms is not None
    assert abs(r.itl.mean_ms - r.tpot.mean_ms) < 0.01
    # ... and TPOT is (e2e - TTFT) over the 11 tokens after the first, request by request,
    # so the means obey it whatever the timing was, to the histograms' resolution: each mean
    # reads every value at its bucket's middle, at most half a bucket off (64 µs buckets at
    # 65-131 ms with 3 significant digits).
    assert r.e2e.mean_ms is not None and r.ttft.mean_ms is not None
    tol = _half_bucket_ms(r.e2e.max_ms) + _half_bucket_ms(r.ttft.max_ms) \
        + 11 * _half_bucket_ms(r.tpot.max_ms) + 0.001
    assert r.e2e.mean_ms - r.ttft.mean_ms == pytest.approx(11 * r.tpot.mean_ms, abs=tol)


def _half_bucket_ms(v_ms: float | None) -> float:
    """Half the width of the HdrHistogram bucket holding `v_ms` (3 significant digits: 2,048
    sub-buckets, so 1 µs wide below 2,048 µs and doubling with each power of two above)."""
    assert v_ms is not None
    us = max(int(v_ms * 1e3), 1)
    return 2.0 ** max(0, us.bit_length() - 1 - 10) / 2 / 1e3


def test_final_usage_still_counts_every_token_and_no_usage_undercounts(
        llm_server: Callable[..., str]) -> None:
    url = llm_server("--ttft-ms", "5", "--gap-ms", "2", "--tokens-per-chunk", "4")
    final = _run(url, usage="final", requests=6)
    assert final.output_tokens == 6 * 12 and final.token_sources == {"usage-final": 6}
    none = _run(url, usage="none", requests=6)
    # One token per chunk: 3 chunks of 4 look like 3 tokens (the vLLM issue 27485 mistake),
    # and the result says so.
    assert none.output_tokens == 6 * 3 and none.token_sources == {"chunks": 6}
    assert any("one per chunk" in n for n in none.notes)


def test_a_stall_shows_in_ttft_p99_in_open_loop(llm_server: Callable[..., str]) -> None:
    url = llm_server("--ttft-ms", "10", "--gap-ms", "2", "--stall-period-s", "2",
                     "--stall-s", "0.6")
    r = _run(url, out=4, mode="open", rate=40, requests=None, duration_s=2.0)
    assert r.requests == 80 and r.successes == 80, (r.errors_by_kind, r.invalid_reasons)
    # Freezes of 600 ms every 2 s: ~30% of requests due in one wait up to 600 ms for a token.
    # The tail waited out a freeze; the median request did not.
    assert r.ttft.p99_ms is not None and r.ttft.p99_ms >= 400
    assert r.ttft.p50_ms is not None and r.ttft.p50_ms < r.ttft.p99_ms / 2


def test_dropped_streams_are_errors_not_fast_requests(llm_server: Callable[..., str]) -> None:
    url = llm_server("--ttft-ms", "5", "--gap-ms", "2", "--drop-every", "3")
    r = _run(url, out=10, concurrency=1, requests=12)
    assert r.errors_by_kind == {"dropped": 4} and (r.successes, r.failures) == (8, 4)
    assert r.output_tokens == 8 * 10  # successes only, all complete
    assert r.failed_output_tokens == 4 * 5  # half of each dropped stream came before the cut


@pytest.mark.slow  # spawning two interpreters takes ~15 s on a loaded two-core machine
def test_two_generator_processes_merge(llm_server: Callable[..., str]) -> None:
    url = llm_server("--ttft-ms", "20", "--gap-ms", "5")
    r = _run(url, out=5, concurrency=4, requests=16, processes=2)
    assert (r.processes, r.successes, r.output_tokens) == (2, 16, 80)
    assert r.itl.count == 16 * 4 and r.ttft.count == 16
    assert r.ttft.p50_ms is not None and r.ttft.p50_ms >= 20 * PREC


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


def test_cli_writes_llm_records_with_goodput_and_cost(
        llm_server: Callable[..., str], tmp_path: Path, realtime_ok: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    # 8 tokens in chunks of 2 due at 30, 50, 70, 90 ms: TPOT (90 - 30) / 7 ≈ 8.6 ms. A request
    # reads under 1 ms only when its first chunk was written or read 53 ms late and its last
    # on time (with a 5 ms gap, 8 ms late did it on a busy machine): the server and the client
    # in SCHED_FIFO where the machine allows.
    url = llm_server("--ttft-ms", "30", "--gap-ms", "20", "--tokens-per-chunk", "2",
                     realtime=realtime_ok)
    recs = tmp_path / "llm.jsonl"
    with realtime() if realtime_ok else contextlib.nullcontext():
        rc = run(["load", "llm", url, "--concurrency", "1,2", "--requests", "6", "--warmup",
                  "0s", "--output-tokens", "8", "--slo", "ttft_p95<1s,tpot_p95<1ms,avail>=99%",
                  "--cores", "2", "--core-hour-usd", "1.8", "--records", str(recs), "--json"])
    # Every level misses TPOT (below): the whole document is printed, then exit status 1.
    assert rc == 1
    out = capsys.readouterr()
    assert out.err.strip() == "objective missed: tpot_p95<1ms at 1; tpot_p95<1ms at 2"
    doc = json.loads(out.out)
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    lv = doc["levels"][0]
    assert lv["successes"] == 6 and lv["output_tokens"] == 48
    # TPOT ≈ 8.6 ms > 1 ms: every request misses TPOT, so goodput is 0.
    assert lv["goodput"]["good_requests"] == 0 and lv["slo_met"] is False
    assert lv["cost"]["per_1k_output_tokens_usd"] == pytest.approx(
        3.6 / 3600 / lv["output_tps"] * 1000)
    got = read_records(recs)
    assert [(r.stage, r.variable, r.level) for r in got] == [("llm", "concurrency", 1.0),
                                                           ("llm", "concurrency", 2.0)]
    r0 = got[0]
    assert r0.rate_unit == "output tokens/s" and r0.extras["latency_is"] == "ttft"
    assert r0.latency is not None and r0.latency.p50_ms == lv["ttft"]["p50_ms"]
    assert r0.input_unit == "prompt tokens" and r0.input_volume == 6 * 128
    assert {"itl", "tpot", "e2e", "goodput", "cost"} <= set(r0.extras)
    assert set(r0.histograms) == {"ttft", "itl", "tpot", "e2e"}
    assert r0.cost is not None and r0.cost.unit == "1k output tokens"


@pytest.mark.parametrize("args", [
    ["--rate", "1", "--output-tokens", "uniform:9"],
    ["--rate", "1", "--slo", "p95<5ms"],
    ["--rate", "1", "--concurrency", "2"],
    [],
])
def test_bad_usage_exits_2_with_one_line(args: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "llm", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "Traceback" not in err


def test_unreachable_server_and_wrong_path_exit_2(llm_server: Callable[..., str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "llm", "http://127.0.0.1:9", "--concurrency", "1", "--requests", "2",
                "--warmup", "0s"]) == 2
    assert "is the server up" in capsys.readouterr().err
    url = llm_server()
    assert run(["load", "llm", url + "/v1/embeddings", "--concurrency", "1", "--requests",
                "1"]) == 2
    assert "does not match --api" in capsys.readouterr().err


def test_capacity_plot_draws_the_steps(llm_server: Callable[..., str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Two short steps: what is drawn must be the JSON's steps, whatever they decided.
    url = llm_server("--max-streams", "2", "--ttft-ms", "20", "--gap-ms", "10")
    saved = capture(monkeypatch)
    out = tmp_path / "capacity.png"
    assert run(["load", "llm", "capacity", url, "--slo", "ttft_p90<100ms", "--start", "4",
                "--arrival", "constant", "--output-tokens", "4", "--min-step", "0.5s",
                "--max-step", "1s", "--max-steps", "2", "--warmup", "0s", "--plot", str(out),
                "--confirm", "0", "--json"]) == 0
    doc = _json(capsys)
    assert_image(out)
    [(fig, _)] = saved
    drawn = lines(fig.axes[0])
    steps = sorted(doc["steps"], key=lambda s: s["rate"])
    assert len(steps) == 2
    rates = [s["rate"] for s in steps]
    for metric in ("ttft", "tpot"):
        for q in ("p50", "p95", "p99"):
            assert drawn[f"{metric.upper()} {q}"] == (rates, [s[metric][f"{q}_ms"]
                                                              for s in steps])


@pytest.mark.slow  # four 1.5-3 s steps: ~15 s of wall time
def test_capacity_search_brackets_a_known_capacity(
        llm_server: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    # 2 decoding slots, each stream 20 + 7 × 10 = 90 ms: exactly 22.2 requests/s.
    url = llm_server("--max-streams", "2", "--ttft-ms", "20", "--gap-ms", "10")
    t0 = time.monotonic()
    # Constant arrivals: below capacity no queue (TTFT 20 ms); above it the queue grows by
    # (rate - 22.2)/s, so at 24/s TTFT passes 100 ms after ~1 s and most of a step misses.
    rc = run(["load", "llm", "capacity", url, "--slo", "ttft_p90<100ms", "--start", "12",
              "--arrival", "constant", "--output-tokens", "8", "--min-step", "1.5s",
              "--max-step", "3s", "--precision", "50%", "--max-steps", "4", "--warmup", "0.5s",
              "--confirm", "3s", "--json"])
    assert rc == 0, time.monotonic() - t0
    doc = _json(capsys)
    lo, hi = doc["interval_rps"]
    assert lo is not None and lo <= 22.3
    assert hi is not None and hi >= 22.2
    # Below the capacity the answer holds its confirmation, whose tokens/s are reported.
    assert doc["confirmed_rps"] == lo
    assert doc["capacity_output_tps"] == pytest.approx(
        next(s["output_tps"] for s in doc["steps"] if s["rate"] == lo and s["confirmation"]))
