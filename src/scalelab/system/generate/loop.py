"""The bridge between the asyncio server and the single-threaded engine.

One thread owns the engine and runs steps back to back while there is work. The event loop
talks to it only through a command queue (add, abort) and gets results back through each
request's asyncio.Queue (via call_soon_threadsafe). An abort is applied before the next step,
so a disconnected client's blocks are free within one step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from scalelab.system.generate.engine import LlmEngine
from scalelab.system.generate.sequence import SamplingParams, Sequence, TokenLogprob


@dataclass
class TextDelta:
    text: str
    num_new_tokens: int
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """The log-probabilities of this event's new tokens (when the request asked for them)."""


@dataclass(eq=False)
class Handle:
    """One request's link to the engine thread."""

    prompt_ids: list[int]
    params: SamplingParams
    deadline: float
    """time.monotonic() after which the engine drops it (reason 'timeout')."""
    events: asyncio.Queue[TextDelta]
    loop: asyncio.AbstractEventLoop
    seq: Sequence | None = None
    done: bool = False
    aborted: bool = field(default=False)
    released: bool = False
    """The server has stopped counting it (set once, whichever way the request ended)."""
    trace: Any = None
    """The server's `spans.GenTrace` when this request is traced (the engine never reads it)."""


class EngineLoop:
    def __init__(self, engine: LlmEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, Handle]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._live: dict[int, Handle] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def num_live(self) -> int:
        """Requests the engine thread still delivers to (0 once every one has ended)."""
        return len(self._live)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompt_ids: list[int], params: SamplingParams, timeout_s: float) -> Handle:
        loop = asyncio.get_running_loop()
        h = Handle(prompt_ids, params, time.monotonic() + timeout_s, asyncio.Queue(), loop)
        self._commands.put(("add", h))
        self._wake.set()
        return h

    def abort(self, h: Handle) -> None:
        if not h.done:
            self._commands.put(("abort", h))
            self._wake.set()

    def _emit(self, h: Handle, ev: TextDelta) -> None:
        if ev.finished:
            h.done = True
        h.loop.call_soon_threadsafe(h.events.put_nowait, ev)

    def _finish_event(self, h: Handle, reason: str) -> TextDelta:
        seq = h.seq
        return TextDelta(
            "",
            0,
            True,
            reason,
            prompt_tokens=len(h.prompt_ids),
            completion_tokens=seq.num_output if seq else 0,
            cached_tokens=seq.cached_prompt_tokens if seq else 0,
        )

    def _drain(self) -> None:
        eng = self.engine
        while True:
            try:
                cmd, h = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                if h.aborted:
                    continue
                try:
                    h.seq = eng.add(h.prompt_ids, h.params)
                except ValueError:  # checked before submit; a race on limits must not kill us
                    self._emit(h, self._finish_event(h, "error"))
                    continue
                self._live[h.seq.seq_id] = h
            elif h.seq is not None and not h.seq.finished:
                eng.abort(h.seq)
                self._live.pop(h.seq.seq_id, None)
                h.done = True
            else:
                h.aborted = True  # not added yet: skip it when its add comes

    def _expire(self) -> None:
        now = time.monotonic()
        for sid, h in list(self._live.items()):
            if now > h.deadline and h.seq is not None and not h.seq.finished:
                self.engine.abort(h.seq, "timeout")
                del self._live[sid]
                self._emit(h, self._finish_event(h, "timeout"))

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop:
                self._drain()
                self._expire()
                if not eng.has_work():
                    if eng.metrics:
                        eng.metrics.gauges(eng)
                    self._wake.wait()
                    self._wake.clear()
                    continue
                for out in eng.step():
                    h = self._live.get(out.seq.seq_id)
                    if h is None:
                        continue
                    seq = out.seq
                    self._emit(
                        h,
                        TextDelta(
                            out.text,
                            out.num_new_tokens,
                            out.finished,
                            seq.finish_reason,
                            prompt_tokens=seq.num_prompt,
                            completion_tokens=seq.num_output,
                            cached_tokens=seq.cached_prompt_tokens,
                            logprobs=seq.logprobs[len(seq.logprobs) - out.num_new_tokens:],
                        ),
                    )
                    if out.finished:
                        del self._live[seq.seq_id]
        except BaseException as e:  # the server answers 503 from here on, and says why
            self.error = e
            for h in list(self._live.values()):
                self._emit(h, self._finish_event(h, "error"))
            self._live.clear()
            raise
