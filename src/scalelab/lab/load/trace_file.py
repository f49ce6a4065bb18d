"""A request trace: one CSV row per request, its arrival time and lengths.

The one file format `load --replay`, `load llm --replay` and `autoscale simulate --trace` read.
A header names the columns; these spellings are accepted (the first three are ours, the others
those of BurstGPT's and Azure's published LLM traces):

    timestamp      | Timestamp | TIMESTAMP        arrival: seconds (any origin), or ISO 8601
    input_tokens   | Request tokens | ContextTokens   prompt length (optional)
    output_tokens  | Response tokens | GeneratedTokens  output length (optional)

Rows need not be sorted; times are shifted so the first arrival is at 0.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from scalelab.lab.core.errors import BadInputError

TIME_COLUMNS = ("timestamp", "Timestamp", "TIMESTAMP")
INPUT_COLUMNS = ("input_tokens", "Request tokens", "ContextTokens")
OUTPUT_COLUMNS = ("output_tokens", "Response tokens", "GeneratedTokens")


@dataclass(frozen=True, kw_only=True)
class RequestTrace:
    """Arrivals (seconds from the first, ascending) and each request's lengths when given."""

    name: str
    times_s: np.ndarray
    input_tokens: np.ndarray | None
    output_tokens: np.ndarray | None

    @property
    def span_s(self) -> float:
        return float(self.times_s[-1]) if len(self.times_s) else 0.0

    def rate_curve(self, bin_s: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(bin centres s, arrivals per second in each bin): the rate curve of this trace."""
        edges = np.arange(0.0, self.span_s + bin_s, bin_s)
        counts, _ = np.histogram(self.times_s, bins=edges)
        centres = (edges[:-1] + edges[1:]) / 2.0
        return tuple(centres.tolist()), tuple((counts / bin_s).tolist())


def is_request_trace(header: list[str]) -> bool:
    """Whether a CSV header is a request trace's (its first column an arrival time)."""
    return bool(header) and header[0].strip() in TIME_COLUMNS


def _column(header: list[str], names: tuple[str, ...]) -> int | None:
    got = [h.strip() for h in header]
    return next((got.index(n) for n in names if n in got), None)


def _time(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise BadInputError(f"{where}: {text!r} is neither seconds nor an ISO 8601 time; "
                            "write e.g. 12.5 or 2023-11-16 18:15:46") from None


def read_trace(path: str | Path) -> RequestTrace:
    """Read a request trace (see the module doc); a bad row raises naming its line."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such trace file; give a CSV with a timestamp column")
    with p.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or not is_request_trace(rows[0]):
        raise BadInputError(f"{p}:1: the header must start with a timestamp column "
                            f"({' or '.join(TIME_COLUMNS)}), then input_tokens,output_tokens")
    header = rows[0]
    ci, co = _column(header, INPUT_COLUMNS), _column(header, OUTPUT_COLUMNS)
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        where = f"{p}:{lineno}"
        times.append(_time(row[0], where))
        try:
            if ci is not None:
                ins.append(int(row[ci]))
            if co is not None:
                outs.append(int(row[co]))
        except (ValueError, IndexError):
            raise BadInputError(f"{where}: token counts must be whole numbers") from None
    if len(times) < 1:
        raise BadInputError(f"{p}: no requests after the header")
    order = np.argsort(np.asarray(times), kind="stable")
    t = np.asarray(times, dtype=float)[order]
    return RequestTrace(name=p.stem, times_s=t - t[0],
                        input_tokens=np.asarray(ins)[order] if ci is not None else None,
                        output_tokens=np.asarray(outs)[order] if co is not None else None)
