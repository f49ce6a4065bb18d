"""The `--fail-on` gate of `scalelab diagnose` and `scalelab report`: whether a verdict lets a
CI job pass, and if not, why, in one line.

`miss` fails when any stage missed an objective; `undecided` also when any check was undecided
or not measured (the verdict's outcome is not "met").
"""

from __future__ import annotations

from typing import Literal

from scalelab.lab.core.verdict import Verdict

FailOn = Literal["miss", "undecided"]


def gate_failure(verdict: Verdict, fail_on: FailOn | None) -> str | None:
    """Why the gate fails (one line), or None when it passes or is not set."""
    if fail_on is None:
        return None
    missed = [s for s in verdict.stages if s.miss is not None]
    if missed:
        return f"gate failed (--fail-on {fail_on}): " + "; ".join(
            f"{s.stage} misses {s.miss.objective.label} at {s.miss.multiple:g}×"
            for s in missed
            if s.miss is not None
        )
    if fail_on == "undecided" and verdict.outcome != "met":
        return "gate failed (--fail-on undecided): " + "; ".join(
            f"{s.stage} {s.outcome}"
            + (f" ({s.open_text})" if s.open_text else "")
            + (f" (not measured: {', '.join(s.not_measured)})" if s.not_measured else "")
            for s in verdict.stages
            if s.outcome != "met"
        )
    return None
