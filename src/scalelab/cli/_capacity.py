"""What `load capacity` and `load llm capacity` say alike: the availability each step was
judged against, and why a search's answer is not confirmed."""

from __future__ import annotations

from typing import Any

import click

from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.capacity import DEFAULT_AVAILABILITY, CapacityResult, Deadline

budget_option = click.option(
    "--budget", default=None,
    help="Time for the whole search, e.g. 2m: no step or confirmation starts that could end "
         "past it (an answer it leaves no time to confirm is reported unconfirmed).")


def deadline(budget: str | None, *, step_s: float, confirm_s: float,
             warmup_s: float) -> Deadline | None:
    """`--budget` as a `Deadline` (None: no budget); each run counts its warm-up and a second
    for its in-flight requests to end."""
    if budget is None:
        return None
    return Deadline(parse_duration(budget, what="--budget"), step_s=step_s + warmup_s + 1.0,
                    confirm_s=confirm_s + warmup_s + 1.0)


def availability_doc(availability: float | None) -> dict[str, Any]:
    """The JSON document's availability: the objective's, or the default's (and which)."""
    return {"availability": DEFAULT_AVAILABILITY if availability is None else availability,
            "availability_default": availability is None}


def availability_line(doc: dict[str, Any]) -> str:
    """One line: the availability every step was judged against, and how."""
    how = ("default: the SLO names none; a step whose failures decide it missed never passes"
           if doc["availability_default"] else "from the SLO")
    return f"availability ≥ {doc['availability'] * 100:g}% ({how})"


def unconfirmed(label: str, res: CapacityResult) -> str:
    """The miss of a search whose answer no confirmation held, and why it stopped."""
    why = res.stopped or "no answer to confirm"
    hint = (" (raise --max-steps to search further below it)" if "step budget" in why else
            " (lower --min-rate to search further below it)" if "floor" in why else
            " (raise --budget)" if "time budget" in why else "")
    if not res.confirmations:
        return f"{label}: the answer is not confirmed; {why}{hint}"
    return f"{label} in the confirmation runs: no rate held; {why}{hint}"
