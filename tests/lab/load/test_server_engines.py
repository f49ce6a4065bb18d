"""Each server's /metrics read by the names its documentation gives (load/server/engines.py),
on exposition text in the shape the docs show (these servers need GPUs or models we do not
have here): two scrapes a level apart, exact numbers out."""

from scalelab.lab.load.server.engines import engine_reading, process_reading, slots_of
from scalelab.layers.web.exposition import sample_sums


def _scrapes(first: str, second: str, dt: float = 2.0) -> list[tuple[float, dict[str, float]]]:
    return [(10.0, sample_sums(first, "a")), (10.0 + dt, sample_sums(second, "b"))]


PROCESS = """# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total {cpu}
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes {rss}
"""


def test_the_standard_process_metrics_give_busy_cores_and_peak_memory() -> None:
    got = process_reading(_scrapes(PROCESS.format(cpu=3.5, rss=5e7),
                                   PROCESS.format(cpu=5.5, rss=4e7), dt=2.0))
    assert got == {"busy_cores": 1.0, "rss_bytes": 50_000_000}


VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {run}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {wait}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
"""


def test_vllm() -> None:
    eng, got = engine_reading(_scrapes(VLLM.format(run=8, wait=3, kv=0.5, pre=2),
                                       VLLM.format(run=6, wait=0, kv=0.97, pre=7)))
    assert eng is not None and eng.name == "vllm"
    assert got == {"running": 8.0, "waiting": 3.0, "kv_cache_use": 0.97, "preemptions": 5.0}


SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {run}
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {wait}
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {kv}
"""


def test_sglang() -> None:
    eng, got = engine_reading(_scrapes(SGLANG.format(run=30, wait=4, kv=0.28),
                                       SGLANG.format(run=32, wait=1, kv=0.31)))
    assert eng is not None and eng.name == "sglang"
    assert got == {"running": 32.0, "waiting": 4.0, "kv_cache_use": 0.31}


TGI = """# TYPE tgi_queue_size gauge
tgi_queue_size {q}
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size {b}
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{{le="+Inf"}} {n}
tgi_request_queue_duration_sum {qs}
tgi_request_queue_duration_count {n}
# TYPE tgi_request_inference_duration histogram
tgi_request_inference_duration_bucket{{le="+Inf"}} {n}
tgi_request_inference_duration_sum {cs}
tgi_request_inference_duration_count {n}
"""


def test_tgi_queue_and_inference_time_per_request() -> None:
    eng, got = engine_reading(_scrapes(TGI.format(q=5, b=4, n=10, qs=1.0, cs=2.0),
                                       TGI.format(q=2, b=4, n=30, qs=9.0, cs=6.0)))
    assert eng is not None and eng.name == "tgi"
    # 20 requests: 8 s queued (400 ms each), 4 s inferring (200 ms each)
    assert got == {"running": 4.0, "waiting": 5.0, "queue_ms": 400.0, "compute_ms": 200.0}


LLAMACPP = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {p}
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {d}
"""


def test_llama_server_metrics_and_slots() -> None:
    eng, got = engine_reading(_scrapes(LLAMACPP.format(p=4, d=0), LLAMACPP.format(p=4, d=6)))
    assert eng is not None and eng.name == "llamacpp"
    assert got == {"running": 4.0, "waiting": 6.0}
    slots = [{"id": i, "is_processing": i < 3} for i in range(4)]
    assert slots_of(slots) == (4, 3)
    assert slots_of({"error": "not found"}) is None and slots_of([]) is None


TRITON = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="resnet",version="1"}} {n}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="resnet",version="1"}} {q}
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{{model="resnet",version="1"}} {ci}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="resnet",version="1"}} {cf}
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{{model="resnet",version="1"}} {co}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="resnet",version="1"}} {pend}
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="GPU-1"}} {g}
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{{gpu_uuid="GPU-1"}} {m}
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization {c}
"""


def test_triton_queue_vs_compute_gpu_and_cpu() -> None:
    a = TRITON.format(n=100, q=0, ci=0, cf=0, co=0, pend=0, g=0.2, m=1e9, c=0.1)
    b = TRITON.format(n=300, q=2_000_000, ci=100_000, cf=800_000, co=100_000, pend=12,
                      g=0.95, m=3e9, c=0.4)
    eng, got = engine_reading(_scrapes(a, b))
    assert eng is not None and eng.name == "triton"
    # 200 requests: 2 s queued (10 ms each), 1 s computing (5 ms each)
    assert got == {"waiting": 12.0, "gpu_util": 0.95, "gpu_memory_bytes": 3_000_000_000,
                   "cpu_util": 0.4, "queue_ms": 10.0, "compute_ms": 5.0}


RAY = """# TYPE ray_serve_deployment_queued_queries gauge
ray_serve_deployment_queued_queries{{deployment="Translator"}} {q}
# TYPE ray_serve_replica_processing_queries gauge
ray_serve_replica_processing_queries{{deployment="Translator",replica="a"}} {p}
ray_serve_replica_processing_queries{{deployment="Translator",replica="b"}} {p}
"""


def test_ray_serve_sums_its_replicas() -> None:
    eng, got = engine_reading(_scrapes(RAY.format(q=7, p=1), RAY.format(q=2, p=2)))
    assert eng is not None and eng.name == "ray-serve"
    assert got == {"waiting": 7.0, "running": 4.0}


def test_a_page_of_no_known_engine_reads_nothing() -> None:
    assert engine_reading(_scrapes(PROCESS.format(cpu=1, rss=1), PROCESS.format(cpu=2, rss=1))) \
        == (None, {})
