"""The server's limit from its own signals (core/server_limits.py) and from the client's records
(core/limits.py's inference), each phrase with its number and its source."""

from recordkit import rec
from scalelab.lab.core.limits import client_inference, infer_limits
from scalelab.lab.core.server_limits import server_cell, server_finding
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.signals import ServerSignals

PROC = "process pid 7 (port 8000)"


def _proc(**kw: object) -> ServerSignals:
    return ServerSignals(sources={"busy_cores": PROC}, kinds={"busy_cores": "process"},
                         cores=2, **kw)  # type: ignore[arg-type]


def test_one_thread_at_one_core_of_two_is_named_so() -> None:
    f = server_finding(_proc(busy_cores=1.0, threads=3, busiest_thread_cores=0.97))
    assert f is not None and f.saturated and f.resource == "server cpu"
    assert f.detail == ("1.00 of 2 cores busy: one core saturated, the work runs on one thread "
                        f"(its busiest thread ran 0.97 cores) ({PROC})")


def test_a_starved_thread_that_wanted_a_whole_core_is_one_core_saturated() -> None:
    f = server_finding(_proc(busy_cores=0.3, cpu_wait_cores=0.68, threads=2,
                             busiest_thread_cores=0.3, busiest_thread_wait_cores=0.66))
    assert f is not None and f.detail.startswith(
        "0.30 of 2 cores busy, 0.98 wanted (0.68 runnable but waiting for a CPU): one core "
        "saturated, the work runs on one thread (its busiest thread ran 0.30 cores and waited "
        "0.66 for a CPU other work held)")


def test_work_spread_over_threads_is_not_one_thread() -> None:
    f = server_finding(_proc(busy_cores=1.0, threads=8, busiest_thread_cores=0.3))
    assert f is not None and not f.saturated
    assert f.detail == f"cpu 1.00 of 2 cores ({PROC})"


def test_both_cores_busy_is_the_cpu() -> None:
    f = server_finding(_proc(busy_cores=1.9))
    assert f is not None and f.detail == f"1.90 of 2 cores busy ({PROC})"


def test_refusals_lead_and_say_their_share() -> None:
    sig = ServerSignals(refused=30, refused_by_status={"503": 30}, requests=120,
                        sources={"refused": "client: 30 × 503"}, kinds={"refused": "client"})
    f = server_finding(sig)
    assert f is not None and f.resource == "admission"
    assert f.detail == ("30 refused with 503 = 25.0% of 120 requests: the server turns work "
                        "away above its admission limit")


def test_engine_slots_and_kv_cache() -> None:
    src = {"waiting": "vllm http://h/metrics", "running": "vllm http://h/metrics"}
    f = server_finding(ServerSignals(engine="vllm", running=4, waiting=6, slots=4, sources=src))
    assert f is not None and f.resource == "engine slots"
    assert f.detail == "up to 4 running of 4 slots, up to 6 waiting (vllm http://h/metrics)"
    kv = server_finding(ServerSignals(kv_cache_use=0.97, preemptions=3,
                                      sources={"kv_cache_use": "sglang x"}))
    assert kv is not None and kv.detail == "KV cache 97% used, 3 preemptions (sglang x)"


def test_the_sheet_cell_leads_with_a_saturated_server() -> None:
    sig = _proc(busy_cores=1.9)
    assert server_cell(sig, "not measured") == f"server cpu: 1.90 of 2 cores busy ({PROC})"
    assert server_cell(sig, "memory: peak 90% of RAM") == \
        f"server cpu: 1.90 of 2 cores busy ({PROC}); memory: peak 90% of RAM"
    assert server_cell(_proc(busy_cores=0.2), "not measured") == \
        f"none saturated (server cpu 0.20 of 2 cores ({PROC}))"
    assert server_cell(None, "not measured") == "not measured"


def _llm(level: int, tps: float, ttft_ms: float) -> object:
    return rec("llm", "concurrency", level, rate=tps, rate_unit="output tokens/s",
               p95=2 * ttft_ms,  # recordkit: p50 = p95 / 2
               extras={"latency_is": "ttft", "e2e_p50_ms": 400.0})


def test_a_plateau_past_four_streams_is_about_four_slots() -> None:
    # 50 tokens/s a stream; flat at 200 from 4 on; TTFT +100 ms per stream past 4
    rows = build_sheet([_llm(1, 50, 30), _llm(2, 100, 30), _llm(4, 200, 30),  # type: ignore
                        _llm(8, 202, 430)])
    ev = client_inference(rows)
    assert [e.resource for e in ev] == ["slots (inferred)", "queue (inferred)"]
    assert ev[0].detail == ("about 4 slots: 200 output tokens/s at 4 in flight, 202 at 8 (flat "
                            "past 4; 50 at 1) — inferred from the client's records")
    assert ev[1].detail.startswith("TTFT p50 30 → 430 ms from 4 to 8 streams: +100 ms per "
                                   "extra stream (one stream alone takes 400 ms)")
    assert infer_limits(rows, cores=2, memory_bytes=2**34)[0].resource == "slots (inferred)"


def test_a_rate_still_growing_infers_nothing() -> None:
    rows = build_sheet([_llm(1, 50, 30), _llm(2, 100, 30), _llm(4, 200, 30),  # type: ignore
                        _llm(8, 390, 30)])
    assert client_inference(rows) == []


def test_refusals_from_a_rate_on_are_the_admission_limit() -> None:
    def lvl(rate: float, refused: int, served: float) -> object:
        sig = ServerSignals(refused=refused, requests=int(rate),
                            refused_by_status={"503": refused} if refused else {},
                            sources={"refused": "client"} if refused else {"rss_bytes": "p"},
                            rss_bytes=1)
        return rec("serve", "rate", rate, rate=served, rate_unit="requests/s", server=sig)

    rows = build_sheet([lvl(10, 0, 10), lvl(100, 50, 50)])  # type: ignore[list-item]
    top = infer_limits(rows, cores=2, memory_bytes=2**34)[0]
    assert top.resource == "admission"
    assert top.detail == ("none refused at rate=10; 50 refused with 503 = 50.0% of 100 "
                          "requests: the server turns work away above its admission limit at "
                          "rate=100; served 50 requests/s there")


def test_the_slot_count_is_the_plateau_over_one_streams_rate_not_the_knee_level() -> None:
    # 4 slots seen at levels 1, 3, 6, 12: the plateau starts at 6 in flight, the slots are 4.
    rows = build_sheet([_llm(1, 50, 30), _llm(3, 150, 30), _llm(6, 200, 80),  # type: ignore
                        _llm(12, 202, 380)])
    assert client_inference(rows)[0].detail.startswith(
        "about 4 slots: 200 output tokens/s at 6 in flight, 202 at 12 (flat past 6; 50 at 1)")


def test_an_engine_line_the_stage_already_said_is_not_repeated() -> None:
    src = {"waiting": "vllm http://h/metrics"}
    sig = ServerSignals(engine="vllm", running=4, waiting=4, sources=src)
    own = "batch-slots: up to 4 sequences running (engine /metrics)"
    assert server_cell(sig, own, stage_said=True) == own
    assert server_cell(sig, "not measured").startswith("engine slots: up to 4 running")


def test_streams_cut_when_a_second_arrives_are_one_request_at_a_time() -> None:
    def lvl(n: int, cut: int) -> object:
        sig = ServerSignals(cut_streams=cut, requests=40, sources={"cut_streams": "client"})
        return rec("llm", "concurrency", n, rate=50.0, server=sig)

    rows = build_sheet([lvl(1, 0), lvl(2, 38), lvl(4, 39)])  # type: ignore[list-item]
    (ev,) = client_inference(rows)
    assert ev.resource == "one request at a time (inferred)"
    assert ev.detail == ("no stream cut short at concurrency=1; 38 of 40 streams (95%) cut short "
                         "or empty at concurrency=2: a new request interrupts the running one — "
                         "inferred from the client's records")
