import pytest
import torch

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.layers.nets.variants import Int8Module
from scalelab.system.compress.measure import MeasureConfig, measure, resolve_device, state_bytes


def _net() -> TabularNet:
    return TabularNet(TabularConfig(cardinalities=[5], n_numeric=3, hidden=[16])).eval()


def test_measure_times_each_batch_size_and_prices_it() -> None:
    net = _net()
    c, x = torch.randint(0, 5, (100, 1)), torch.randn(100, 3)
    cfg = MeasureConfig(batch_sizes=[1, 8], calls=10, warmup=2, threads=1,
                        price_per_core_hour=3.6)
    before = torch.get_num_threads()
    m = measure(net, c, x, cfg, device="cpu")
    assert torch.get_num_threads() == before
    assert [t.batch_size for t in m.timings] == [1, 8]
    assert all(t.p95_ms >= t.p50_ms > 0 for t in m.timings)
    assert m.throughput_rows_per_s == m.at(8).rows_per_s  # type: ignore[union-attr]
    # 3.6 USD/core-hour = 0.001 USD/core-second; 1,000 predictions take 1000/rate seconds
    assert m.cost_per_1000_usd == pytest.approx(0.001 * 1000 / m.throughput_rows_per_s)
    assert m.model_bytes == sum(p.numel() * 4 for p in net.parameters())
    assert m.peak_memory_bytes > m.model_bytes
    assert m.device.startswith("cpu")


def test_int8_state_bytes_are_smaller() -> None:
    net = _net()
    assert state_bytes(Int8Module(net)) < state_bytes(net)


def test_device_resolution() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(BadUsageError, match="CUDA"):
            resolve_device("cuda")
    with pytest.raises(BadUsageError):
        resolve_device("tpu")
    with pytest.raises(BadUsageError):
        MeasureConfig(batch_sizes=[0])
    with pytest.raises(BadUsageError):
        measure(_net(), torch.zeros((4, 1), dtype=torch.long), torch.zeros(4, 3),
                MeasureConfig(batch_sizes=[32], calls=1), device="cpu")


def test_median_of_rounds_is_exact() -> None:
    from scalelab.system.compress.measure import BatchTiming, Measurement, median_of

    def m(p50: float, rate: float, cost: float) -> Measurement:
        return Measurement(device="cpu: x", timings=[BatchTiming(batch_size=1, p50_ms=p50,
                                                                 p95_ms=2 * p50, rows_per_s=rate)],
                           throughput_rows_per_s=rate, peak_memory_bytes=int(p50 * 10),
                           model_bytes=5, cost_per_1000_usd=cost, threads=1)

    out = median_of([m(1.0, 100.0, 0.2), m(3.0, 50.0, 0.4), m(2.0, 400.0, 0.05)])
    t = out.at(1)
    assert t is not None and (t.p50_ms, t.p95_ms, t.rows_per_s) == (2.0, 4.0, 100.0)
    assert out.throughput_rows_per_s == 100.0
    assert out.cost_per_1000_usd == pytest.approx(0.2)  # price fixed: cost scales as 1/rate
    assert out.peak_memory_bytes == 30
    with pytest.raises(BadUsageError):
        median_of([])


def test_median_of_pools_the_calls_for_quantiles_with_a_count() -> None:
    """The record's latency quantiles rest on every timed call of every round (order
    statistics of the pooled calls), so the verdict can decide them on their count."""
    from scalelab.system.compress.measure import BatchTiming, Measurement, median_of

    def m(samples: range) -> Measurement:
        t = BatchTiming(batch_size=1, p50_ms=1.0, p95_ms=1.0, rows_per_s=1.0,
                   samples_ms=tuple(float(v) for v in samples))
        return Measurement(device="cpu: x", timings=[t], throughput_rows_per_s=1.0,
                           peak_memory_bytes=1, model_bytes=1, cost_per_1000_usd=0.0, threads=1)

    t = median_of([m(range(101, 201)), m(range(1, 101))]).at(1)
    assert t is not None and len(t.samples_ms) == 200
    # the ⌈q·200⌉-th smallest of 1..200
    assert t.quantiles() == {0.5: 100.0, 0.9: 180.0, 0.95: 190.0, 0.99: 198.0, 0.999: 200.0,
                             1.0: 200.0}
    assert BatchTiming(batch_size=1, p50_ms=1.0, p95_ms=1.0, rows_per_s=1.0).quantiles() == {}
