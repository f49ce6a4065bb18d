"""--arrival gamma:CV, --ramp STAGES and --replay FILE --speed X of `load run` and `load llm
run`: each turned into one arrival string the plans carry (lab/load/arrival.py), with the one
level's mean rate and length."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import numpy as np

from scalelab.cli._output import stacked
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.arrival import check_arrival, ramp_length


def _check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else check_arrival(value)


def arrival_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--arrival, checked at parse time (a plain choice of constant/poisson before)."""
    return click.option(
        "--arrival", default=default, callback=_check, show_default=True,
        help="Open loop arrivals: constant, poisson, or gamma:CV (bursty: gamma gaps with "
             "that coefficient of variation; gamma:1 is Poisson).")


arrival_options: Callable[[Callable[..., Any]], Callable[..., Any]] = stacked([
    click.option("--ramp", help="Open loop stages ramping the rate linearly from 0, k6-like: "
                 "DURATION:RATE,... e.g. 30s:10,2m:50,30s:0 (one level; --arrival sets the "
                 "process)."),
    click.option("--replay", type=click.Path(dir_okay=False),
                 help="Send at the arrival times of a request trace CSV (timestamp[,input_tokens,"
                      "output_tokens]; BurstGPT's and Azure's column names too)."),
    click.option("--speed", type=float, default=1.0, show_default=True,
                 help="With --replay: play the trace this many times faster."),
])
"""The flags `resolve` reads from a command's **kw."""


def resolve(kw: dict[str, Any], *, arrival: str, rate: float | None, rates: str | None,
            concurrency: str | None, duration: str | None, n_requests: int | None,
            warmup: str) -> tuple[str, float | None, str | None]:
    """(arrival, rate, duration) for the plans: as given, or the ramp's or the trace's (their
    mean rate over the measured window, and their length less the warm-up). Pops --ramp and
    --speed."""
    # --replay stays in kw: `load llm` takes each request's lengths from it (_dataset.py).
    ramp, replay, speed = kw.pop("ramp", None), kw.get("replay"), kw.pop("speed", 1.0)
    if ramp is None and replay is None:
        return arrival, rate, duration
    flag = "--ramp" if ramp is not None else "--replay"
    if ramp is not None and replay is not None:
        raise BadUsageError("give --ramp or --replay, not both")
    if any(x is not None for x in (rate, rates, concurrency, duration, n_requests)):
        raise BadUsageError(f"{flag} sets the rate and the length of its one level; drop "
                            "--rate/--rates/--concurrency/--duration/--requests")
    warm = parse_duration(warmup, what="--warmup")
    if ramp is not None:
        total, mean = ramp_length(ramp, skip_s=warm)
        spec = f"{arrival}+ramp:{ramp}"
    else:
        from scalelab.lab.load.trace_file import read_trace

        if not speed > 0:
            raise BadUsageError(f"--speed {speed:g} must be above 0")
        trace = read_trace(str(replay))
        total = trace.span_s / speed
        if len(trace.times_s) < 2 or total <= 0:
            raise BadUsageError(f"--replay {replay}: needs 2 or more arrivals at distinct times")
        measured = int(np.count_nonzero(trace.times_s / speed >= warm))
        mean = measured / (total - warm) if total > warm else 0.0
        spec = f"replay:{speed:g}:{replay}"
    if total <= warm:
        raise BadUsageError(f"{flag} lasts {total:.3g} s, not more than --warmup {warm:g} s; "
                            "lengthen it or shorten --warmup")
    if not mean > 0:
        raise BadUsageError(f"{flag}: no arrivals after the --warmup {warm:g} s")
    if replay is not None:
        total += 1e-3  # the last arrival falls inside [0, length)
    return check_arrival(spec), mean, f"{total - warm}s"
