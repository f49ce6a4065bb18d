"""What `load capacity` and `load llm capacity` say alike: the availability each step was
judged against, and why a search's answer is not confirmed."""

from __future__ import annotations

from typing import Any

from scalelab.lab.load.capacity import DEFAULT_AVAILABILITY, CapacityResult


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
            " (lower --min-rate to search further below it)" if "floor" in why else "")
    return f"{label} in the confirmation runs: no rate held; {why}{hint}"
