"""Load generation on a real Dask cluster: a `dask scheduler` and two `dask worker` processes on
127.0.0.1 (one thread each, no nanny), started once for the module and torn down after it.

The targets are the deterministic servers of the other load tests, so the merged percentiles
are held to the same truth as a single process's (the LLM server's own times, with each
worker's measured starvation as the only slack: test_llm_stream.py), and the
shares' counts are exact: worker i gets every 2nd due time from i, so the shares sum to the
single-process schedule.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from llmkit import (
    JITTER_MS,
    assert_within_truth,
    fifo_threads,
    llm_server,
    server_truth,
    watch_start,
    watch_stop,
)
from scalelab.cli import run
from scalelab.lab.core.errors import RunFailedError
from scalelab.lab.load import cluster as cluster_mod
from scalelab.lab.load.clock import LagStats
from scalelab.lab.load.cluster import (
    WORKERS,
    Cluster,
    WorkerClock,
    describe,
    named_reasons,
    share_times,
    shares,
)
from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.result import validity
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.level import split_list
from scalelab.lab.load.llm.run import LlmPlan, run_llm
from scalelab.lab.load.llm.stream import StreamConfig
from scalelab.lab.load.llm.workload import LengthDist, Workload
from scalelab.lab.load.send import Target, build_request

HTTP_SERVERS = Path(__file__).with_name("servers.py")
PREC = 0.999  # as test_llm_stream.py: HdrHistogram at 3 significant digits reads ≤ 0.1% low


def _dask(*args: str) -> subprocess.Popen[bytes]:
    # The workers import this tree's scalelab (the tasks name its functions). Dask's sampling
    # profiler walks every thread's stack each 10 ms under the GIL: off, as
    # docs/load-cluster.md says.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    return subprocess.Popen([sys.executable, "-c",
                             "import sys; from distributed.cli import dask_" + args[0] +
                             " as m; sys.argv[0] = 'dask'; m.main()", *args[1:]],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _worker(sched_file: Path, *extra: str) -> subprocess.Popen[bytes]:
    return _dask("worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                 "--no-nanny", "--host", "127.0.0.1", "--dashboard-address", ":0",
                 "--death-timeout", "60", *extra)


HOG = """
import sys, threading

def _spin():
    while True:
        pass

def dask_setup(worker):
    # A thread that never gives the GIL back before the switch interval: the generator's loop
    # runs only in 100 ms slices, so its sends go out up to 100 ms late.
    sys.setswitchinterval(0.1)
    threading.Thread(target=_spin, daemon=True).start()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A scheduler and two workers on 127.0.0.1; every process is killed afterwards."""
    f = tmp_path_factory.mktemp("dask") / "scheduler.json"
    procs = [_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file",
                   str(f), "--dashboard-address", ":0")]
    try:
        deadline = time.monotonic() + 60
        while not f.exists() or not f.read_text().strip():
            assert procs[0].poll() is None, "dask scheduler exited"
            assert time.monotonic() < deadline, "dask scheduler did not start in 60 s"
            time.sleep(0.1)
        procs += [_worker(f), _worker(f)]
        with Cluster(json.loads(f.read_text())["address"]) as c:
            c.client.wait_for_workers(2, timeout=90)
            c.sched_file = f  # type: ignore[attr-defined]
            yield c
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def llm_url() -> Iterator[str]:
    with llm_server("--ttft-ms", "40", "--gap-ms", "12", "--tokens-per-chunk", "3") as url:
        yield url


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(HTTP_SERVERS), "fixed", "--service-ms", "5"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    yield f"http://127.0.0.1:{int(line.split()[1])}"
    proc.kill()
    proc.wait(timeout=10)


def _llm_plan(url: str, *, requests: int, rate: float | None = None, concurrency: int = 1,
              warmup_s: float = 0.0) -> LlmPlan:
    t = Target.parse(url + "/v1/chat/completions")
    reqs = Workload(output=LengthDist(kind="fixed", a=12), usage="continuous",
                    distinct=4).build(t)
    mode = "closed" if rate is None else "open"
    return LlmPlan(stream=StreamConfig(target=t, requests=reqs, mode=mode, timeout_s=20.0,
                                       concurrency=concurrency, warmup_s=warmup_s),
                   rate=rate, arrival="constant", requests=requests)


def _http_plan(url: str, *, rate: float, duration_s: float | None = None,
               requests: int | None = None, arrival: str = "constant", seed: int = 0,
               warmup_s: float = 0.0, processes: int = 1) -> LoadPlan:
    t = Target.parse(url + "/")
    req = build_request(t, method="GET", path=t.path, body=None)
    return LoadPlan(engine=HttpConfig(target=t, requests=[req], mode="open",
                                        warmup_s=warmup_s),
                    rate=rate, arrival=arrival, duration_s=duration_s,  # type: ignore[arg-type]
                    requests=requests, seed=seed, processes=processes)


def test_two_workers_merge_ttft_and_tpot_to_the_servers_truth(cluster: Cluster,
                                                             llm_url: str) -> None:
    # Closed loop, as the single-process truth test: a busy machine's late sends would count
    # in an open loop's TTFT (timed from the due time) but not in the server's truth. The
    # warm-up keeps a fresh worker's first requests (its first connections and code paths,
    # ~10 ms slower on a loaded machine) out, as a long-lived test process has no such first.
    seen = len(server_truth(llm_url)["ttft_ms"])
    cluster.client.run(watch_start)
    r = run_llm(_llm_plan(llm_url, requests=20, concurrency=4, warmup_s=0.5), cluster=cluster)
    # Each worker's own starvation during the run: how late its client could read a chunk.
    lag = JITTER_MS + max(cluster.client.run(watch_stop).values())
    assert (r.processes, r.requests, r.successes, r.output_tokens) == (2, 20, 20, 20 * 12)
    assert r.ttft.count == 20 and r.itl.count == 20 * 11
    # 12 tokens = chunks of 3 due at 40, 52, 64, 76 ms (test_llm_stream.py's truth); the
    # server saw the warm-up's streams as well, and the merged medians are held to its times.
    truth = server_truth(llm_url, skip=seen)
    assert len(truth["ttft_ms"]) == 20 + r.warmup_requests
    assert min(truth["ttft_ms"]) >= 40 and min(truth["e2e_ms"]) >= 76
    assert_within_truth(r, truth, lag)
    assert r.cluster is not None
    ws = r.cluster.workers
    assert len({w.address for w in ws}) == 2
    # Each worker ran half the clients and sent exactly half the requests.
    assert [w.requests for w in ws] == [10, 10] and sum(w.requests for w in ws) == r.requests
    # Same host, same CLOCK_MONOTONIC: the worker's reading lies inside the round trip, so the
    # NTP estimate is within its stated uncertainty of the true offset, 0.
    for w in ws:
        assert abs(w.clock_offset_ms) <= w.clock_uncertainty_ms
    assert r.valid and all(w.valid for w in ws)


def test_open_loop_llm_shares_are_the_schedule_interleaved(cluster: Cluster,
                                                           llm_url: str) -> None:
    r = run_llm(_llm_plan(llm_url, rate=10, requests=20), cluster=cluster)
    assert (r.requests, r.successes, r.output_tokens) == (20, 20, 20 * 12)
    assert r.cluster is not None
    ws = r.cluster.workers
    assert [w.offered_rps for w in ws] == [5.0, 5.0] and r.offered_rps == 10
    assert [w.requests for w in ws] == [10, 10]
    # A late send only adds to TTFT (timed from the due time): never under the server's 40 ms.
    assert r.ttft.p50_ms is not None and r.ttft.p50_ms >= 40 * PREC
    # Every worker's own reason reaches the level, naming that worker by index and address;
    # nothing else is put on a worker; and the level is valid only with no reason at all.
    named = [x for x in r.invalid_reasons if x.startswith("worker ")]
    want = sorted(f"worker {w.index} ({w.address} on {w.host}): {why}"
                  for w in ws for why in w.invalid_reasons)
    assert sorted(named) == want
    assert r.valid == (not r.invalid_reasons) and (not want or not r.valid)


def test_http_shares_sum_to_the_single_process_schedule(cluster: Cluster,
                                                        http_url: str) -> None:
    plan = _http_plan(http_url, rate=40, duration_s=1.5)
    times = plan.times().tolist()
    r = run_load(plan, cluster=cluster)
    assert r.cluster is not None
    assert r.requests == len(times) == 60 and r.successes == 60, r.errors_by_kind
    assert [w.requests for w in r.cluster.workers] == [len(split_list(times, 2, i))
                                                       for i in range(2)] == [30, 30]
    assert sum(w.offered_rps or 0.0 for w in r.cluster.workers) == r.offered_rps == 40
    # A 5 ms server, timed from the due time: never under 5 ms.
    assert r.latency.p50_ms is not None and r.latency.p50_ms >= 5 * PREC
    assert r.cold_start_ms is not None and r.cold_start_ms >= 5 * PREC


def test_a_worker_killed_mid_level_fails_the_level_naming_it(cluster: Cluster,
                                                            http_url: str) -> None:
    before = set(cluster.workers())
    third = _worker(cluster.sched_file)  # type: ignore[attr-defined]
    try:
        cluster.client.wait_for_workers(3, timeout=90)
        (victim,) = set(cluster.workers()) - before
        out: list[BaseException] = []

        def level() -> None:
            try:
                run_load(_http_plan(http_url, rate=30, duration_s=3.0), cluster=cluster)
            except BaseException as e:
                out.append(e)

        th = threading.Thread(target=level)
        th.start()
        deadline = time.monotonic() + 60
        # Mid-level: the victim holds its share of the level (not the cold-start probe).
        while not any(str(k).startswith("scalelab-load-")
                      for k in cluster.client.processing([victim]).get(victim, ())):
            assert time.monotonic() < deadline and th.is_alive(), out
            time.sleep(0.05)
        third.send_signal(signal.SIGKILL)
        th.join(timeout=120)
        assert not th.is_alive()
    finally:
        third.kill()
        third.wait(timeout=10)
    assert len(out) == 1 and isinstance(out[0], RunFailedError), out
    msg = str(out[0])
    assert victim in msg and "left the cluster mid-level" in msg and "rerun" in msg
    # The cluster is whole again: the next level runs on the two that remain.
    assert set(cluster.workers()) == before
    r = run_load(_http_plan(http_url, rate=20, duration_s=1.0), cluster=cluster)
    assert r.requests == 20 and r.successes == 20 and r.cluster is not None
    assert len(r.cluster.workers) == 2


@pytest.mark.slow  # its GIL-hogging thread keeps a core busy for ~15 s on a 2-core CI machine
def test_a_slow_worker_makes_the_level_invalid_naming_it(
        cluster: Cluster, http_url: str, tmp_path: Path) -> None:
    before = set(cluster.workers())
    hog = tmp_path / "hog.py"
    hog.write_text(HOG)
    slow = _worker(cluster.sched_file, "--preload", str(hog))  # type: ignore[attr-defined]
    try:
        cluster.client.wait_for_workers(3, timeout=90)
        (victim,) = set(cluster.workers()) - before
        # 100 req/s a worker: its lag limit is one 10 ms gap; the slow one is up to 100 ms late.
        r = run_load(_http_plan(http_url, rate=300, duration_s=2.0), cluster=cluster)
    finally:
        slow.kill()
        slow.wait(timeout=10)
    assert r.cluster is not None and r.requests == 600
    (w,) = [w for w in r.cluster.workers if w.address == victim]
    assert not w.valid and w.lag_p99_ms is not None and w.lag_p99_ms > 10.0
    assert not r.valid
    assert any(x.startswith(f"worker {w.index} ({victim} on ") for x in r.invalid_reasons)
    deadline = time.monotonic() + 60
    while set(cluster.workers()) != before:
        assert time.monotonic() < deadline, "the slow worker did not leave"
        time.sleep(0.1)


@contextlib.contextmanager
def punctual(cluster: Cluster, enabled: bool) -> Iterator[None]:
    """This process, the scheduler and the workers in SCHED_FIFO for the block, where the
    machine allows (`realtime_ok`): a level's start goes from the client through the scheduler
    to each worker, and each worker's sends are then timed by its own loop."""
    if not enabled:
        yield
        return
    fifo_threads(True)
    cluster.client.run_on_scheduler(fifo_threads, True)
    cluster.client.run(fifo_threads, True)
    try:
        yield
    finally:
        cluster.client.run(fifo_threads, False)
        cluster.client.run_on_scheduler(fifo_threads, False)
        fifo_threads(False)


def test_cli_llm_capacity_runs_each_step_on_the_cluster(
        cluster: Cluster, llm_url: str, realtime_ok: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A step of 4 sends is invalid when one of them goes out 10 ms late (over 5% of its sends:
    # llm.result.LAG_INVALID_SHARE), and the search then stops with no step to confirm. On a
    # busy machine the start's hand-off (client, scheduler, worker) and a normal worker's
    # wake-ups queue behind other processes for that long: all of them in SCHED_FIFO here.
    with punctual(cluster, realtime_ok):
        rc = run(["load", "llm", "capacity", llm_url, "--slo", "ttft_p90<1s", "--start", "4",
                  "--max-steps", "1", "--max-step", "1s", "--min-step", "1s", "--warmup", "0s",
                  "--arrival", "constant", "--output-tokens", "12", "--confirm", "1s",
                  "--cluster", cluster.address, "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    # The step, then its confirmation: on the cluster too, at full length (a confirmation the
    # busy machine's generator could not offer is run again before it counts).
    step, *_, conf = doc["steps"]
    assert step["rate"] == 4 and step["requests"] == 4
    assert conf["confirmation"] and conf["rate"] == 4 and conf["requests"] == 4


def test_cli_bad_cluster_address_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["load", "run", "http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
              "--cluster", "127.0.0.1:8786"])
    assert rc == 2
    assert "tcp://HOST:PORT" in capsys.readouterr().err



def test_sweep_runs_each_level_on_a_worker_and_records_its_host(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "r.jsonl"
    # The command reports its parent process, the metric the sweep records: a worker, not us.
    script = "import json, os; print(json.dumps({'ppid': os.getppid()}))"
    rc = run(["sweep", "--var", "n=1,2", "--metric", "json:ppid", "--records", str(rec),
              "--cluster", cluster.address, "--json", "--", sys.executable, "-c", script])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    recs = doc["records"]
    worker_pids = set(cluster.client.run(os.getpid).values())
    assert [r["level"] for r in recs] == [1, 2]
    assert all(r["ok"] and int(r["rate"]) in worker_pids for r in recs), recs
    hosts = {c.host for c in cluster.clocks(cluster.workers(), rounds=1)}
    assert all(r["extras"]["host"] in hosts for r in recs)


def test_processes_with_a_cluster_is_refused(cluster: Cluster, http_url: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["load", "run", http_url, "--rate", "10", "--duration", "1s", "--processes", "2",
              "--cluster", cluster.address])
    assert rc == 2
    assert "dask worker --nworkers N" in capsys.readouterr().err


def test_worker_shares_are_judged_alone_and_named() -> None:
    clocks = [WorkerClock(address="tcp://a:1", host="ha", offset_s=0.002, rtt_s=0.004),
              WorkerClock(address="tcp://b:2", host="hb", offset_s=-0.5, rtt_s=0.010)]
    verdicts = {"pa": (10, 5.0, 0.2, []), "pb": (9, 4.0, 80.0, ["generator fell behind"])}
    level = shares(["pa", "pb"], clocks, scheduler="tcp://s:8786", offered_rps=10.0,
                   judge=lambda part, n: verdicts[part])
    a, b = level.workers
    assert (a.offered_rps, a.clock_offset_ms, a.clock_uncertainty_ms) == (5.0, 2.0, 2.0)
    assert (b.clock_offset_ms, b.clock_uncertainty_ms) == (-500.0, 5.0)
    assert a.valid and not b.valid and b.requests == 9
    assert named_reasons(level) == ["worker 1 (tcp://b:2 on hb): generator fell behind"]


def test_a_cluster_levels_fix_asks_for_workers_not_processes() -> None:
    reasons = validity(mode="open", offered_rps=1000.0, sent_rps=500.0, scheduled_rps=1000.0,
                       lag=LagStats(count=10, p50_ms=0.1, p99_ms=0.5, max_ms=1.0, late=0),
                       pool_waits=0, slo_threshold_s=None, processes=2, more=WORKERS)
    assert len(reasons) == 1 and "add Dask workers (now 2)" in reasons[0]
    assert "--processes" not in reasons[0]


@pytest.mark.parametrize(("arrival", "length"), [("constant", {"duration_s": 2.0}),
                                                 ("poisson", {"duration_s": 2.0}),
                                                 ("poisson", {"requests": 997})])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_shares_rebuilt_from_their_description_are_the_schedule_split(
        arrival: str, length: dict[str, float], p: int) -> None:
    # What a worker does with its Share (no cluster needed: the same function runs there).
    plan = _http_plan("http://127.0.0.1:9", rate=1234.5, arrival=arrival, seed=7,
                      warmup_s=0.5, processes=p, **length)  # type: ignore[arg-type]
    whole = plan.times()
    got = [share_times(plan, sh) for sh in describe(whole, p)]
    assert all(g is not None for g in got)
    rebuilt = np.empty(len(whole))
    for i, g in enumerate(got):
        assert g is not None
        rebuilt[i::p] = g
    # Exact: the interleaved shares are the single-process schedule, and no due time is in two.
    assert np.array_equal(rebuilt, whole)
    assert sum(len(g or []) for g in got) == len(whole) == len(set(whole.tolist()))
    assert all(not set(a or []) & set(b or []) for i, a in enumerate(got) for b in got[i + 1:])


def test_a_share_rebuilt_differently_from_the_clients_fails_clearly() -> None:
    client_plan = _http_plan("http://127.0.0.1:9", rate=100, duration_s=1.0, arrival="poisson",
                             seed=1)
    worker_plan = _http_plan("http://127.0.0.1:9", rate=100, duration_s=1.0, arrival="poisson",
                             seed=2)
    (sh,) = describe(client_plan.times(), 1)
    with pytest.raises(RunFailedError, match=r"rebuilt a different schedule.*numpy versions"):
        share_times(worker_plan, sh)
    assert share_times(client_plan, sh) == client_plan.times().tolist()
    assert share_times(client_plan, None) is None


def test_workers_rebuild_their_shares_exactly(cluster: Cluster) -> None:
    # The rebuild on the real worker processes (their own imports and numpy), not only here.
    plan = _http_plan("http://127.0.0.1:9", rate=5000, duration_s=1.0, arrival="poisson",
                      seed=3, processes=2)
    whole = plan.times()
    got = [cluster.call(share_times, plan, sh, prefer=w, timeout_s=60)
           for sh, w in zip(describe(whole, 2), cluster.workers(), strict=True)]
    assert got == [whole[0::2].tolist(), whole[1::2].tolist()]


def test_a_slow_hand_out_of_shares_still_starts_the_level(
        cluster: Cluster, http_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # At large offers the client took long to hand the shares out (each carried its due times):
    # the first worker said ready, and closed the ready queue, before the client had opened it,
    # so the scheduler dropped the queue with the worker's ready in it and the level failed
    # "not ready 120 s after the level was handed out". Each hand-out is held back a second
    # here, as a large share's pickling did; the tasks must also be small whatever the offer.
    monkeypatch.setattr(cluster_mod, "READY_TIMEOUT_S", 20.0)
    real_submit = cluster.client.submit
    sizes: list[int] = []

    def slow_submit(fn: Any, *args: Any, **kw: Any) -> Any:
        if getattr(fn, "__name__", "") == "_remote_part":
            sizes.append(len(cloudpickle.dumps(args)))
        fut = real_submit(fn, *args, **kw)
        time.sleep(1.0)
        return fut

    monkeypatch.setattr(cluster.client, "submit", slow_submit)
    plan = _http_plan(http_url, rate=5000, duration_s=0.4)
    r = run_load(plan, cluster=cluster)
    assert r.cluster is not None
    assert r.requests == 2000 and [w.requests for w in r.cluster.workers] == [1000, 1000]
    # Two tasks, each a description of a few hundred bytes: 1,000 due times alone pickle to
    # 9 kB, and a 120,000 req/s level's to megabytes.
    assert len(sizes) == 2 and all(n < 2000 for n in sizes), sizes
    assert len(cloudpickle.dumps(plan.times()[0::2].tolist())) > 9000
