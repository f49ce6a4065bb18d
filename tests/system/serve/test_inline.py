"""Where a version's batches compute: the inline policy's decisions, and a real worker's."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import torch
from torch import nn

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.worker import InlinePolicy, Job, VersionWorker

MS = 1e-3


def test_first_batch_on_the_thread_then_a_probe_then_inline_while_it_fits() -> None:
    p = InlinePolicy(below_s=1 * MS, probe_every=4)
    assert p.next_inline() is False  # nothing timed yet
    p.record(inline=False, cpu_s=1.1 * MS, wall_s=1.3 * MS)  # the thread: over the threshold
    assert p.next_inline() is True  # but under twice it: the second batch probes inline
    p.record(inline=True, cpu_s=0.8 * MS, wall_s=0.9 * MS)
    assert [p.next_inline() for _ in range(5)] == [True] * 5  # the inline cost decides now
    assert p.inline_cpu_s == 0.8 * MS and p.thread_cpu_s == 1.1 * MS


def test_inline_cost_over_the_threshold_goes_back_to_the_thread_and_probes_every_n() -> None:
    p = InlinePolicy(below_s=1 * MS, probe_every=4)
    p.record(inline=False, cpu_s=1.2 * MS, wall_s=1.2 * MS)
    assert p.next_inline() is True
    p.record(inline=True, cpu_s=1.5 * MS, wall_s=1.5 * MS)  # the probe: too slow inline too
    assert [p.next_inline() for _ in range(8)] == [False, False, False, True,
                                                   False, False, False, True]


def test_a_model_over_twice_the_threshold_is_never_probed() -> None:
    p = InlinePolicy(below_s=1 * MS, probe_every=2)
    p.record(inline=False, cpu_s=2.5 * MS, wall_s=2.5 * MS)
    assert not any(p.next_inline() for _ in range(50))


def test_a_model_that_waits_rather_than_computes_is_never_probed() -> None:
    p = InlinePolicy(below_s=1 * MS, probe_every=2)
    p.record(inline=False, cpu_s=0.1 * MS, wall_s=30 * MS)  # 30 ms of sleeping, little CPU
    assert not any(p.next_inline() for _ in range(50))


def test_zero_threshold_means_always_the_thread() -> None:
    p = InlinePolicy(below_s=0.0, probe_every=1)
    p.record(inline=False, cpu_s=1e-6, wall_s=1e-6)
    assert not any(p.next_inline() for _ in range(10))


class Spin(nn.Module):
    """A linear layer that also burns `ms` of CPU per forward (a CPU-bound slow model)."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.thread_time() + self.ms / 1000
        while time.thread_time() < end:
            pass
        return self.lin(x)


def _serve(module: nn.Module, batches: int) -> VersionWorker:
    cfg = ModelConfig.model_validate({
        "name": "tiny", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}],
        "max_batch_size": 4, "dynamic_batching": {"max_queue_delay_ms": 0}})
    torch.manual_seed(0)
    worker = VersionWorker(model="tiny", version=1, module=module, cfg=cfg, pre=None,
                           metrics=Metrics(), sampler=None)
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    want = torch.softmax(module(torch.from_numpy(x)), 1).detach().numpy()

    async def go() -> None:
        worker.start()
        loop = asyncio.get_running_loop()
        for i in range(batches):  # one job at a time: one batch each
            job = Job(inputs=[x], rows=1, request_id=f"r{i}", enqueued_at=time.monotonic(),
                      deadline=time.monotonic() + 600, future=loop.create_future())
            worker.submit(job)
            out = await asyncio.wait_for(job.future, 60)
            np.testing.assert_allclose(out["probabilities"], want, rtol=1e-6)
        await worker.stop(drain_s=1)

    asyncio.run(go())
    return worker


def test_a_tiny_model_computes_inline_after_its_first_batch() -> None:
    w = _serve(nn.Linear(3, 2), batches=10)
    # 9 on a quiet machine (the probe is the second batch); a first batch slowed past 10x the
    # threshold in wall time by a loaded machine delays the probe by a batch or two
    assert 6 <= w.inline_batches <= 9


def test_a_cpu_bound_slow_model_stays_on_its_thread() -> None:
    w = _serve(Spin(ms=5.0), batches=6)
    assert w.inline_batches == 0
    assert w.placement.thread_cpu_s >= 5e-3
