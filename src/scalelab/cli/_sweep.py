"""The load sweep's levels from the flags `scalelab load run` and `scalelab load llm run`
share: one rate, a list of rates, a list of client counts, or multiples of a base."""

from __future__ import annotations

from scalelab.cli._output import parse_list
from scalelab.core.errors import BadUsageError
from scalelab.load.http.generator import Mode


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
