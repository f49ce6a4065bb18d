"""What `scalelab load run` and `scalelab load llm run` share: the level flags, the sweep they
give (one rate, a list of rates, a list of client counts, or multiples of a base), the loop
over its levels with progress, and the formats both tables print."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import click

from scalelab.cli._arrival import arrival_option, arrival_options
from scalelab.cli._output import Decorator, err_console, parse_list, stacked
from scalelab.cli._progress import live_progress
from scalelab.cli._progress import shown as progress_shown
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.schedule import Mode

DEFAULT_MULTIPLES = "1,2,5,10"

trace_sample_option = click.option(
    "--trace-sample", "trace_sample", type=float, default=0.0, show_default=True,
    help="Share of measured requests sent with a fresh sampled W3C traceparent; their trace "
         "ids are in the result (--json).")
"""`--trace-sample`, as `load run` and `load llm run` both take it."""


def level_options(*, rate_help: str, concurrency_help: str, loop_default: str, loop_help: str,
                  multiples_help: str | None, processes_help: str
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The sweep's flags, in the order both commands list them (--rate ... --processes); the
    help texts and the default loop are each command's own."""
    opts: list[Decorator] = [
        click.option("--rate", type=float, help=rate_help),
        click.option("--rates", help="Open loop sweep: comma-separated rates, one record each."),
        click.option("--concurrency", help=concurrency_help),
        click.option("--base", type=float, help="Sweep --multiples of this rate (or concurrency)."),
        click.option("--loop", type=click.Choice(["open", "closed"]), default=loop_default,
                     show_default=True, help=loop_help),
        click.option("--multiples", default=DEFAULT_MULTIPLES, show_default=True,
                     help=multiples_help),
        arrival_option("poisson"),
        arrival_options,
        click.option("--duration", help="Measured time per level (default 10s), warm-up excluded."),
        click.option("--requests", "n_requests", type=int,
                     help="Measured requests per level instead."),
        click.option("--warmup", default="1s", show_default=True,
                     help="Unmeasured warm-up per level."),
        click.option("--processes", type=int, default=1, show_default=True, help=processes_help),
    ]
    return stacked(opts)


def levels(rate: float | None, rates: str | None, concurrency: str | None, base: float | None,
           loop: str, multiples: str, *, examples: str = "--rates 100,200,500, "
           "--concurrency 1,2,5,10") -> tuple[Mode, list[float]]:
    """The sweep's mode and levels from the load flags (`scalelab load run` and `load llm`);
    `examples` are the example sweeps the error shows."""
    given = [x is not None for x in (rate, rates, concurrency, base)]
    if sum(given) > 1:
        raise BadUsageError("give one of --rate, --rates, --concurrency or --base")
    if rate is not None:
        return "open", [rate]
    if rates is not None:
        return "open", parse_list(rates, what="--rates")
    if concurrency is not None:
        return "closed", [float(c) for c in parse_list(concurrency, what="--concurrency", kind=int)]
    if base is not None:
        ms = parse_list(multiples, what="--multiples")
        mode: Mode = "closed" if loop == "closed" else "open"
        return mode, [float(round(base * m)) if mode == "closed" else base * m for m in ms]
    raise BadUsageError(f"say how much load: --rate R (open loop), {examples} (closed loop) "
                        "or --base B (1x,2x,5x,10x)")


def lengths(duration: str | None, n_requests: int | None,
            warmup: str) -> tuple[float | None, float]:
    """Each level's measured duration (None: --requests counts instead) and warm-up."""
    if duration is not None and n_requests is not None:
        raise BadUsageError("give --duration or --requests, not both")
    dur = None if n_requests is not None else parse_duration(duration or "10s", what="--duration")
    return dur, parse_duration(warmup, what="--warmup")


def each_level(sweep: list[float], mode: Mode, *, label: str, clients: str,
               as_json: bool) -> Iterator[tuple[int, float, int]]:
    """(index, level, clients) for each level, under one progress bar: the note names the
    level, and without a bar (and without --json) a line on stderr does."""
    with live_progress("load", total=len(sweep)) as progress:
        for i, level in enumerate(sweep):
            if level <= 0:
                raise BadUsageError(f"levels must be positive, got {level}")
            conc = int(level) if mode == "closed" else 1
            what = f"{level:g} req/s" if mode == "open" else f"{conc} {clients}"
            progress.update(note=f"{label}: {what}")
            if not as_json and not progress_shown():
                err_console.print(f"[dim]{label}: {what} ...[/]")
            yield i, level, conc
            progress.advance()


def level_of(lv: dict[str, Any]) -> float:
    """A level's JSON: its rate (open loop) or its clients (closed)."""
    return float(lv["offered_rps"] if lv["mode"] == "open" else lv["concurrency"])


def fmt_ms(v: float | None) -> str:
    """Milliseconds with the digits that matter (3 significant, at least whole ms)."""
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def fraction(text: str, *, what: str) -> float:
    """'95%' or '0.95' -> 0.95."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise BadUsageError(f"{what}: {text!r} is not a percentage like 95%") from None
