"""The `--fail-on` gate of `scalelab diagnose` and `scalelab report`: whether a verdict lets a
CI job pass, and if not, why, in one line.

`miss` fails when any stage missed an objective; `undecided` also when any check was undecided
or not measured (the verdict's outcome is not "met").
"""

from __future__ import annotations

from typing import Literal

from scalelab.lab.core.units import format_multiple
from scalelab.lab.core.verdict import Verdict
from scalelab.lab.report.verdict_text import gap_text, open_text

FailOn = Literal["miss", "undecided"]


def gate_failure(verdict: Verdict, fail_on: FailOn | None) -> str | None:
    """Why the gate fails (one line), or None when it passes or is not set: read off the
    verdict object (each stage's outcome, miss and undecided checks)."""
    if fail_on is None:
        return None
    missed = [s for s in verdict.stages if s.miss is not None]
    if missed:
        return f"gate failed (--fail-on {fail_on}): " + "; ".join(
            f"{s.stage} misses {s.miss.objective.label} at {format_multiple(s.miss.multiple)}"
            for s in missed
            if s.miss is not None
        )
    if fail_on == "undecided" and verdict.outcome != "met":
        return "gate failed (--fail-on undecided): " + "; ".join(
            f"{s.stage} {s.outcome}"
            + (f" ({open_text(s)})" if s.undecided else "")
            + (f" (not measured: {', '.join(gap_text(g) for g in s.not_measured)})"
               if s.not_measured else "")
            for s in verdict.stages
            if s.outcome not in ("met", "no objectives")
        )
    return None
