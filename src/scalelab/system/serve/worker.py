"""One model version's inference worker: a bounded queue, the batcher loop and a private thread.

Requests become `Job`s on the event loop; the batcher (batching.collect) forms batches; the
forward pass runs on this version's own single thread, so the event loop keeps accepting and
answering while torch computes, and a slow or broken model only ever blocks its own queue —
except for models whose batches take less than `inline_below_ms` (InlinePolicy), which compute
on the loop itself (the hand-off would cost more than the forward). A batch that raises is
retried one job at a time, so one bad input fails alone. What the thread runs (eager torch,
TorchScript or ONNX Runtime) is prepared at load time by `serve.runtimes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.nets.onnx import OnnxNet
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.batching import BatchPolicy, collect
from scalelab.system.serve.features import Preprocess
from scalelab.system.serve.metrics import Metrics, observe_many
from scalelab.system.serve.request_sample import RequestSampler
from scalelab.system.serve.runtimes import (
    COMPUTED,
    Outputs,
    WithOutputs,
    check_outputs,
    onnx_outputs,
)
from scalelab.system.serve.stats import VersionStats
from scalelab.system.serve.tensors import FEED_DTYPES, NP_DTYPES
from scalelab.system.serve.text import TextEncoder

log = logging.getLogger("scalelab.system.serve")



@dataclass(kw_only=True, eq=False, slots=True)
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


def _ewma(old: float, new: float) -> float:
    return new if not old else 0.8 * old + 0.2 * new


@dataclass(kw_only=True)
class InlinePolicy:
    """Where a version's next batch computes: on the event loop ("inline") or on its thread.

    Inline while the CPU per batch *measured inline* stays under `below_s` (and the wall time
    under 10x it: a model that sleeps or waits is not CPU-bound and stays off the loop). Why
    each mode keeps its own estimate: the same batch costs more CPU on the thread (the GIL
    changing hands, caches cold on the other core — ~1.0-1.1 ms against 0.85 inline for 16
    rows of the benchmark's MLP), so one estimate fed from whichever mode ran settles in
    either mode near the threshold, and which one a server ended in decided its throughput
    (closed loop 270 vs 360 CPU us a request, repeats of the same run). The first batch runs
    on the thread, which times it; while on the thread, every `probe_every`-th batch (the
    second one first) runs inline to measure the inline cost, but only while the thread's
    cost is under twice the threshold, so a slow model never blocks the loop to be probed."""

    below_s: float
    probe_every: int = 32
    inline_cpu_s: float = 0.0
    inline_wall_s: float = 0.0
    thread_cpu_s: float = 0.0
    thread_wall_s: float = 0.0
    _since_probe: int = -1

    def _fits(self, cpu_s: float, wall_s: float) -> bool:
        return 0.0 < cpu_s < self.below_s and wall_s < 10 * self.below_s

    def next_inline(self) -> bool:
        if self.below_s <= 0:
            return False
        if self.inline_cpu_s and self._fits(self.inline_cpu_s, self.inline_wall_s):
            return True
        if not self.thread_cpu_s:
            return False  # nothing timed on the thread yet
        if self._since_probe < 0:
            self._since_probe = self.probe_every - 1  # probe at the next chance
        self._since_probe += 1
        if self._since_probe >= self.probe_every and self._fits(self.thread_cpu_s / 2,
                                                                 self.thread_wall_s / 2):
            self._since_probe = 0
            return True
        return False

    def record(self, *, inline: bool, cpu_s: float, wall_s: float) -> None:
        if inline:
            self.inline_cpu_s = _ewma(self.inline_cpu_s, cpu_s)
            self.inline_wall_s = _ewma(self.inline_wall_s, wall_s)
        else:
            self.thread_cpu_s = _ewma(self.thread_cpu_s, cpu_s)
            self.thread_wall_s = _ewma(self.thread_wall_s, wall_s)


class VersionWorker:
    """Queue + batcher + thread for one (model, version)."""

    def __init__(self, *, model: str, version: int, module: nn.Module, cfg: ModelConfig,
                 pre: Preprocess | None, metrics: Metrics, sampler: RequestSampler | None,
                 text: TextEncoder | None = None) -> None:
        check_outputs(cfg)
        self.onnx = onnx_outputs(module, cfg) if isinstance(module, OnnxNet) else None
        """An ONNX version's graph with its outputs appended: forward runs it directly."""
        if not isinstance(module, (WithOutputs, torch.jit.ScriptModule)):
            module = WithOutputs(module)  # a ScriptModule: to_torchscript()'s, already wrapped
        self.module: nn.Module | None = None if self.onnx is not None else module
        """None while `onnx` runs the graph: the eager net and its own session are let go
        (one copy of the weights, not two)."""
        self.model, self.version, self.cfg, self.pre = model, version, cfg, pre
        self.text = text
        """A text model's tokenizer (its one BYTES input becomes the network's two)."""
        self._casts = [FEED_DTYPES[t.datatype] if FEED_DTYPES[t.datatype] !=
                       NP_DTYPES[t.datatype] else None for t in cfg.inputs]
        """Per input, the dtype the network takes where it differs from the wire's."""
        self._cast = any(c is not None for c in self._casts)
        self.stats = VersionStats()
        """Triton-style statistics (GET /v2/models/{name}/stats)."""
        self.version_label = str(version)
        """The version as metrics and responses spell it."""
        self._wanted = [(COMPUTED.index(t.name), t.name) for t in cfg.outputs]
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
        """Wall seconds per batch, either mode (Retry-After's estimate)."""
        self.placement = InlinePolicy(below_s=cfg.inline_below_ms / 1000.0)
        """Inline or on the thread, from CPU per batch (the computing thread's own clock:
        wall time is no guide on a busy machine, where a 50 us forward can take milliseconds
        while the thread waits for a core)."""
        self.inline_batches = 0
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
            raise HttpError(503, f"model '{self.model}' version {self.version} is unloading; "
                                  "retry", headers={"Retry-After": "1"})
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise HttpError(429, f"model '{self.model}' version {self.version}: queue full "
                                  f"({self.queue.maxsize} waiting); retry later",
                             headers={"Retry-After": str(self.retry_after_s())}) from None
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
                    _fail(j, HttpError(504, f"deadline passed after {waited:.0f} ms in the "
                                             "queue; dropped before compute"))
                batch = [j for j in formed.batch if not j.future.done()]
                self._depth.set(self.depth())
                if not batch:
                    continue
                observe_many(self._queue_wait, [j.picked_at - j.enqueued_at for j in batch])
                observe_many(self._batch_wait, [now - j.picked_at for j in batch])
                inline = self.placement.next_inline()
                if inline:
                    self.inline_batches += 1
                    done = self._compute(batch)
                else:
                    done = await loop.run_in_executor(self.executor, self._compute, batch)
                self.placement.record(inline=inline, cpu_s=done.cpu_seconds,
                                      wall_s=done.seconds)
                self._compute_s.observe(done.seconds)
                self._batch_rows.observe(done.rows)
                t_out = time.perf_counter_ns()
                results = done.results if done.results is not None else \
                    split(batch, done.joined)
                if self.traced:
                    self._mark(batch, now)
                for j, r in zip(batch, results, strict=True):
                    if j.future.done():
                        continue
                    if isinstance(r, BaseException):
                        j.future.set_exception(r)
                    else:
                        j.future.set_result(r)
                self.stats.executed(
                    rows=done.rows, requests=len(batch),
                    queue_ns=int(sum(now - j.enqueued_at for j in batch) * 1e9),
                    input_ns=done.input_ns, infer_ns=done.infer_ns,
                    output_ns=time.perf_counter_ns() - t_out, at_ms=int(time.time() * 1000))
            except asyncio.CancelledError:
                raise
            except Exception:  # the batcher must outlive any single bad batch
                log.exception("batcher for %s/%s failed a round; continuing", *self._labels)
                # the round's jobs left the queue: answer them, or their requests wait forever
                for j in batch:
                    _fail(j, HttpError(500, "internal server error while batching this "
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
            _fail(j, HttpError(503, f"model '{self.model}' was unloaded before this request ran"))
        self.pending.clear()
        self.executor.shutdown(wait=True)
        self._depth.set(0)

    # -- inference thread side -----------------------------------------------------------------

    def prepare(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """A request's (or batch's) tensors as the network takes them: a text model's text
        tokenized, wider unsigned integers and BF16 widened (FEED_DTYPES)."""
        if self.text is not None:
            return self.text(arrays[0])
        if not self._cast:
            return arrays
        return [a if c is None else a.astype(c) for a, c in zip(arrays, self._casts, strict=True)]

    def forward(self, arrays: list[np.ndarray]) -> Outputs:
        """The outputs for network-ready tensors (`prepare`'s)."""
        if self.onnx is not None:
            got = self.onnx.run([np.ascontiguousarray(a) for a in arrays])
            return {name: got[i] for i, name in self._wanted}
        assert self.module is not None
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        with torch.inference_mode():
            computed = self.module(*tensors)
        return {name: computed[i].numpy() for i, name in self._wanted}

    def _one(self, job: Job) -> Outputs | BaseException:
        try:
            return self.forward(self.prepare(job.inputs))
        except Exception as e:
            return HttpError(500, f"model '{self.model}' version {self.version} failed on this "
                                   f"request: {type(e).__name__}: {e}")

    def _compute(self, batch: list[Job]) -> Computed:
        """The batch's forward pass (on the version's thread, or inline). Only the forward
        and the sample write run here; the loop splits the outputs per job and observes the
        metrics, so the thread holds the GIL as briefly as it can."""
        t0, c0 = time.perf_counter(), time.thread_time()
        m0 = time.monotonic() if self.traced else 0.0
        rows = sum(j.rows for j in batch)
        joined: Outputs | None = None
        results: list[Outputs | BaseException] | None = None
        t_in = t_infer = time.perf_counter_ns()
        try:
            n_in = len(batch[0].inputs)
            ready = self.prepare([np.concatenate([j.inputs[i] for j in batch])
                                  if len(batch) > 1 else batch[0].inputs[i]
                                  for i in range(n_in)])
            t_infer = time.perf_counter_ns()
            joined = self.forward(ready)
        except Exception:
            # one bad input must not fail its batch-mates: retry each alone
            results = [self._one(j) for j in batch]
        t_done = time.perf_counter_ns()
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if self.traced:  # the forward's own window, on the clock the request's spans use
            self._window = (m0, time.monotonic())
        self.batch_s_ewma = _ewma(self.batch_s_ewma, dt)
        if self.sampler is not None:
            if results is None:  # split here once; the loop then uses these
                results = split(batch, joined)
            for j, r in zip(batch, results, strict=True):
                if j.log_sample and not isinstance(r, BaseException):
                    try:
                        self.sampler.record(request_id=j.request_id, model=self.model,
                                            version=self.version,
                                            input_names=[t.name for t in self.cfg.inputs],
                                            inputs=j.inputs, outputs=r, pre=self.pre)
                    except OSError:
                        log.exception("request sample write failed; serving continues")
        return Computed(joined=joined, results=results, rows=rows, seconds=dt, cpu_seconds=dc,
                        input_ns=t_infer - t_in, infer_ns=t_done - t_infer)


@dataclass(frozen=True, slots=True)
class Computed:
    """A batch's outcome: the joined outputs, and one result per job when they were already
    split (a failed batch retried job by job, or the request sample) — else the loop splits."""

    joined: Outputs | None
    results: list[Outputs | BaseException] | None
    rows: int
    seconds: float
    cpu_seconds: float
    """The computing thread's own CPU clock over the batch."""
    input_ns: int = 0
    """Joining the requests' tensors and `prepare` (tokenizing, widening)."""
    infer_ns: int = 0
    """The forward pass (and, for a failed batch, the job-by-job retry)."""


def split(batch: list[Job], joined: Outputs | None) -> list[Outputs | BaseException]:
    """Each job's rows of the batch's outputs (views, no copies)."""
    assert joined is not None
    if len(batch) == 1:
        return [joined]
    out: list[Outputs | BaseException] = []
    start = 0
    for j in batch:
        end = start + j.rows
        out.append({k: v[start:end] for k, v in joined.items()})
        start = end
    return out


def _fail(job: Job, err: HttpError) -> None:
    if not job.future.done():
        job.future.set_exception(err)
