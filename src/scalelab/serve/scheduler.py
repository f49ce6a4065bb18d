"""One model version's inference worker: a bounded queue, the batcher loop and a private thread.

Requests become `Job`s on the event loop; the batcher (batching.collect) forms batches; the
forward pass runs on this version's own single thread, so the event loop keeps accepting and
answering while torch computes, and a slow or broken model only ever blocks its own queue —
except for models whose batches take less than `inline_below_ms`, which compute on the loop
itself (the hand-off would cost more than the forward). A
batch that raises is retried one job at a time, so one bad input fails alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from scalelab.serve.batching import BatchPolicy, collect
from scalelab.serve.config import ModelConfig
from scalelab.serve.features import Preprocess
from scalelab.serve.metrics import Metrics, observe_many
from scalelab.serve.protocol import NP_DTYPES, ServeError
from scalelab.serve.sampling import RequestSampler

log = logging.getLogger("scalelab.serve")

Outputs = dict[str, np.ndarray]
OUTPUT_KINDS = ("probabilities", "label", "logits")


@dataclass(kw_only=True, eq=False)
class Job:
    """One request's tensors on their way through the queue."""

    inputs: list[np.ndarray]
    rows: int
    request_id: str
    enqueued_at: float
    deadline: float
    future: asyncio.Future[Outputs]
    picked_at: float = 0.0
    log_sample: bool = True
    """False for shadow mirrors, which must not double the request sample."""
    traced: bool = False
    """Its request is sampled for tracing: the batcher leaves `batch` on it."""
    batch: BatchMarks | None = None


@dataclass(kw_only=True, frozen=True, slots=True)
class BatchMarks:
    """What a traced job's batch looked like (monotonic seconds): the batch is shared by many
    requests, so each traced request's spans carry its id and size rather than a span of its
    own (see docs/observe.md)."""

    batch_id: int
    """Per version worker, counted over traced batches only."""
    rows: int
    requests: int
    dispatched_at: float
    compute_start: float
    compute_end: float


# architectures without data-dependent control flow or Python side effects (the fault ones in
# faults.py have both, so they always run eagerly)
TRACE_SAFE = frozenset({"tabular_mlp"})


def trace(module: nn.Module, cfg: ModelConfig) -> nn.Module:
    """TorchScript-trace `module` on zero inputs shaped by the config; the eager module if the
    trace fails or disagrees with it. Why: eager torch releases and re-takes the GIL at every
    op, and each re-take waits out the switch interval while the event loop runs Python."""
    example = tuple(torch.zeros([2 if d == -1 else d for d in t.shape],
                                dtype=getattr(torch, NP_DTYPES[t.datatype].name))
                    for t in cfg.inputs)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.freeze(torch.jit.trace(module, example, check_trace=False).eval())
            want = module(*example)
            for _ in range(3):  # the profiling executor optimises after a few runs
                got = traced(*example)
        if not torch.allclose(want, got, atol=1e-5):
            log.warning("trace of %s disagrees with eager; serving eagerly", cfg.name)
            return module
        return traced
    except Exception as e:  # a model that cannot be traced is still served, eagerly
        log.warning("model %s cannot be traced (%s); serving eagerly", cfg.name, e)
        return module


def check_outputs(cfg: ModelConfig) -> None:
    bad = [t.name for t in cfg.outputs if t.name not in OUTPUT_KINDS]
    if bad:
        raise ValueError(f"outputs {bad} are not computable; this server returns "
                         f"{list(OUTPUT_KINDS)} from the network's logits")


class VersionWorker:
    """Queue + batcher + thread for one (model, version)."""

    def __init__(self, *, model: str, version: int, module: nn.Module, cfg: ModelConfig,
                 pre: Preprocess | None, metrics: Metrics, sampler: RequestSampler | None) -> None:
        check_outputs(cfg)
        self.model, self.version, self.module, self.cfg, self.pre = model, version, module, cfg, pre
        self.metrics = metrics
        self.sampler = sampler
        db = cfg.dynamic_batching
        self.policy = BatchPolicy(max_batch_size=cfg.max_batch_size,
                                  max_delay_s=db.max_queue_delay_ms / 1000.0,
                                  preferred=tuple(db.preferred_batch_sizes))
        self.queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=db.max_queue_size)
        self.pending: list[Job] = []
        self.executor = ThreadPoolExecutor(max_workers=1,
                                           thread_name_prefix=f"infer-{model}-{version}")
        self.closing = False
        self.batch_s_ewma = 0.0
        self.batch_cpu_ewma = 0.0
        """CPU seconds per batch (the thread's own clock): what computing inline would block
        the loop for. Wall time is no guide on a busy machine, where a 50 us forward can take
        milliseconds while the thread waits for a core."""
        self.inline_below_s = cfg.inline_below_ms / 1000.0
        self.idle_dispatch = db.dispatch_when_idle
        self.traced = False
        """Set by the first traced job; until then (tracing off) the batcher does no trace
        bookkeeping beyond testing this flag once per batch."""
        self._traced_batches = 0
        self._window = (0.0, 0.0)
        self._task: asyncio.Task[None] | None = None
        self._labels = lb = (model, str(version))
        # metric children looked up once: .labels() takes a lock and builds a key every call
        self._depth = metrics.queue_depth.labels(*lb)
        self._queue_wait = metrics.queue_wait_seconds.labels(*lb)
        self._batch_wait = metrics.batch_wait_seconds.labels(*lb)
        self._compute_s = metrics.compute_seconds.labels(*lb)
        self._batch_rows = metrics.batch_size.labels(*lb)
        self._depth_due = False
        """A queue-depth update is scheduled for this loop turn (submit sets the gauge once a
        turn, not once a job: in multiprocess mode every set is an mmap write)."""

    # -- event-loop side -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.model}-{self.version}")

    def depth(self) -> int:
        return self.queue.qsize() + len(self.pending)

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained (at least 1: Retry-After is integral)."""
        batches = self.depth() / self.cfg.max_batch_size
        return int(min(60, max(1, math.ceil(batches * max(self.batch_s_ewma, 0.001)))))

    def submit(self, job: Job) -> None:
        if self.closing:
            raise ServeError(503, f"model '{self.model}' version {self.version} is unloading; "
                                  "retry", {"Retry-After": "1"})
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise ServeError(429, f"model '{self.model}' version {self.version}: queue full "
                                  f"({self.queue.maxsize} waiting); retry later",
                             {"Retry-After": str(self.retry_after_s())}) from None
        if not self._depth_due:  # one gauge write per loop turn, however many arrive in it
            self._depth_due = True
            asyncio.get_running_loop().call_soon(self._depth_now)

    def _depth_now(self) -> None:
        self._depth_due = False
        self._depth.set(self.depth())

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch: list[Job] = []
            try:
                formed = await collect(self.queue, self.pending, self.policy,
                                       dispatch_when_idle=self.idle_dispatch)
                now = time.monotonic()
                for j in formed.expired:
                    waited = (now - j.enqueued_at) * 1000
                    _fail(j, ServeError(504, f"deadline passed after {waited:.0f} ms in the "
                                             "queue; dropped before compute"))
                batch = [j for j in formed.batch if not j.future.done()]
                self._depth.set(self.depth())
                if not batch:
                    continue
                observe_many(self._queue_wait, [j.picked_at - j.enqueued_at for j in batch])
                observe_many(self._batch_wait, [now - j.picked_at for j in batch])
                if self.inline(self.batch_cpu_ewma, self.batch_s_ewma):
                    results = self._compute(batch)
                else:
                    results = await loop.run_in_executor(self.executor, self._compute, batch)
                if self.traced:
                    self._mark(batch, now)
                for j, r in zip(batch, results, strict=True):
                    if j.future.done():
                        continue
                    if isinstance(r, BaseException):
                        j.future.set_exception(r)
                    else:
                        j.future.set_result(r)
            except asyncio.CancelledError:
                raise
            except Exception:  # the batcher must outlive any single bad batch
                log.exception("batcher for %s/%s failed a round; continuing", *self._labels)
                # the round's jobs left the queue: answer them, or their requests wait forever
                for j in batch:
                    _fail(j, ServeError(500, "internal server error while batching this "
                                             "request; see the server log"))

    def _mark(self, batch: list[Job], dispatched_at: float) -> None:
        traced = [j for j in batch if j.traced]
        if not traced:
            return
        self._traced_batches += 1
        marks = BatchMarks(batch_id=self._traced_batches, rows=sum(j.rows for j in batch),
                           requests=len(batch), dispatched_at=dispatched_at,
                           compute_start=self._window[0], compute_end=self._window[1])
        for j in traced:
            j.batch = marks

    def inline(self, cpu_s: float, wall_s: float) -> bool:
        """Compute on the event loop? Only once a batch has been timed (on the thread), while
        the recent CPU per batch is under the threshold and the wall time under 10x it (the
        slack is for a busy machine; a model that sleeps or waits is past it)."""
        return 0.0 < cpu_s < self.inline_below_s and wall_s < 10 * self.inline_below_s

    async def stop(self, *, drain_s: float = 30.0) -> None:
        """Refuse new jobs, let queued ones finish (bounded), then free the thread."""
        self.closing = True
        deadline = time.monotonic() + drain_s
        while self.depth() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        leftover = self.pending + [self.queue.get_nowait() for _ in range(self.queue.qsize())]
        for j in leftover:
            _fail(j, ServeError(503, f"model '{self.model}' was unloaded before this request ran"))
        self.pending.clear()
        self.executor.shutdown(wait=True)
        self._depth.set(0)

    # -- inference thread side -----------------------------------------------------------------

    def forward(self, arrays: list[np.ndarray]) -> Outputs:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        with torch.inference_mode():
            logits = self.module(*tensors).float()
            probs = torch.softmax(logits, dim=1)
        out: Outputs = {"logits": logits.numpy(), "probabilities": probs.numpy(),
                        "label": probs.argmax(dim=1).numpy().astype(np.int64)}
        return {t.name: out[t.name] for t in self.cfg.outputs}

    def _one(self, job: Job) -> Outputs | BaseException:
        try:
            return self.forward(job.inputs)
        except Exception as e:
            return ServeError(500, f"model '{self.model}' version {self.version} failed on this "
                                   f"request: {type(e).__name__}: {e}")

    def _compute(self, batch: list[Job]) -> list[Outputs | BaseException]:
        t0, c0 = time.perf_counter(), time.thread_time()
        m0 = time.monotonic() if self.traced else 0.0
        rows = sum(j.rows for j in batch)
        results: list[Outputs | BaseException]
        try:
            n_in = len(batch[0].inputs)
            joined = [np.concatenate([j.inputs[i] for j in batch]) if len(batch) > 1
                      else batch[0].inputs[i] for i in range(n_in)]
            out = self.forward(joined)
            bounds = np.cumsum([0] + [j.rows for j in batch])
            results = [{k: v[bounds[i]:bounds[i + 1]] for k, v in out.items()}
                       for i in range(len(batch))]
        except Exception:
            # one bad input must not fail its batch-mates: retry each alone
            results = [self._one(j) for j in batch] if len(batch) > 1 else [self._one(batch[0])]
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if self.traced:  # the forward's own window, on the clock the request's spans use
            self._window = (m0, time.monotonic())
        self.batch_s_ewma = dt if not self.batch_s_ewma else 0.8 * self.batch_s_ewma + 0.2 * dt
        self.batch_cpu_ewma = dc if not self.batch_cpu_ewma else \
            0.8 * self.batch_cpu_ewma + 0.2 * dc
        self._compute_s.observe(dt)
        self._batch_rows.observe(rows)
        if self.sampler is not None:
            for j, r in zip(batch, results, strict=True):
                if j.log_sample and not isinstance(r, BaseException):
                    try:
                        self.sampler.record(request_id=j.request_id, model=self.model,
                                            version=self.version,
                                            input_names=[t.name for t in self.cfg.inputs],
                                            inputs=j.inputs, outputs=r, pre=self.pre)
                    except OSError:
                        log.exception("request sample write failed; serving continues")
        return results


def _fail(job: Job, err: ServeError) -> None:
    if not job.future.done():
        job.future.set_exception(err)
