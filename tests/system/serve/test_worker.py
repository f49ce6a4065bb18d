"""The version worker's batcher: a round that fails after taking jobs still answers them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
import torch

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.worker import Job, VersionWorker


class BrokenSampler:
    """A request sample whose writer has a bug (not an OSError, which the worker tolerates)."""

    def record(self, **_: Any) -> None:
        raise RuntimeError("sampler bug")


def test_a_failed_round_answers_its_jobs_with_500() -> None:
    cfg = ModelConfig.model_validate({
        "name": "tiny", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
        "max_batch_size": 4})
    torch.manual_seed(0)
    worker = VersionWorker(model="tiny", version=1, module=torch.nn.Linear(3, 2), cfg=cfg,
                           pre=None, metrics=Metrics(), sampler=BrokenSampler())  # type: ignore[arg-type]

    async def go() -> None:
        worker.start()
        loop = asyncio.get_running_loop()
        jobs = [Job(inputs=[np.ones((1, 3), np.float32)], rows=1, request_id=f"r{i}",
                    enqueued_at=time.monotonic(), deadline=time.monotonic() + 600,
                    future=loop.create_future()) for i in range(2)]
        for j in jobs:
            worker.submit(j)
        for j in jobs:  # before the fix these waited forever; 60 s only bounds a hang
            with pytest.raises(HttpError) as e:
                await asyncio.wait_for(j.future, 60)
            assert e.value.status == 500
        await worker.stop(drain_s=1)

    asyncio.run(go())
