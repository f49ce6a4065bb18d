"""What an open-loop streaming level served inside its measured window (warm-up included).

Successes completed and output tokens delivered between the window's start and its
planned end (or an early stop), as `load.result.throughput` counts a plain HTTP level.

An overloaded level's warm-up leaves a queue; the measured requests wait behind it, so their
own span stretches past the window while the server drains it, and successes over that span
read as less than the server's capacity (a plateau read as a decline). Counting what the
server finished inside the window, whoever sent it, reads the capacity.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from scalelab.lab.load.llm.sse import Answer
from scalelab.lab.load.llm.tokens import tokens_per_event


@dataclass
class ServedWindow:
    """Each success's end and its tokens' arrival times (8 bytes an event), counted against
    the window once the level is over."""

    ends: array[float] = field(default_factory=lambda: array("d"))
    token_at: array[float] = field(default_factory=lambda: array("d"))
    token_n: array[int] = field(default_factory=lambda: array("q"))

    def add(self, ans: Answer, tokens: list[int] | None = None) -> None:
        """Keep one answer if it succeeded; `tokens`: its tokens per event, when known."""
        if tokens is None:
            tokens = tokens_per_event(ans.events)[0]
            if ans.failure(tokens) is not None:
                return
        self.ends.append(ans.end)
        self.token_at.extend(ans.times)
        self.token_n.extend(tokens)

    def count(self, t0: float, t1: float) -> tuple[int, int]:
        """(successes completed, output tokens delivered) within [t0, t1]."""
        ends = np.frombuffer(self.ends, dtype=np.float64)
        at = np.frombuffer(self.token_at, dtype=np.float64)
        n = np.frombuffer(self.token_n, dtype=np.int64)
        return int(((ends >= t0) & (ends <= t1)).sum()), int(n[(at >= t0) & (at <= t1)].sum())
