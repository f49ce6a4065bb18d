"""Failed stages: a step that could not measure (refused connections, a server that never
started, every request an error) fails its stage, in the verdict, the report and the exit code.

A failed step is not a miss: the system under test did not answer, so no objective was judged
there. The verdict core knows only what the records measured; this module adds what the run
itself knows (run.json's failed steps) and what the records say of a stage whose every request
failed, so "no stage misses its objectives" never reads over a stage that never answered.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import Verdict

FAILED = "failed"


def stage_failures(run_info: dict[str, Any], sheet: list[SheetRow]) -> dict[str, str]:
    """Stage name -> why it failed: its failed steps (run.json), or every request of every
    level it measured answered with an error (the records)."""
    out: dict[str, list[str]] = {}
    for f in run_info.get("failed_steps") or []:
        stage = f.get("stage")
        if isinstance(stage, str) and stage:
            out.setdefault(stage, []).append(f"{f.get('step')}: {f.get('error')}")
    by_stage: dict[str, list[SheetRow]] = {}
    for r in sheet:
        by_stage.setdefault(r.stage, []).append(r)
    for stage, rows in by_stage.items():
        rates = [r.failure_rate for r in rows if r.failure_rate is not None]
        if rates and len(rates) == len(rows) and all(x >= 1.0 for x in rates):
            levels = ", ".join(sorted({f"{r.multiple:g}×" for r in rows}))
            out.setdefault(stage, []).append(
                f"every request failed at every level measured ({levels})")
    return {
        s: whys[0] + (f" (and {len(whys) - 1} more failed step(s); see run.json)"
                      if len(whys) > 1 else "")
        for s, whys in out.items()
    }


def with_failures(verdict: Verdict, failures: dict[str, str]) -> Verdict:
    """The verdict with its summary leading on the failed stages (the report prints the
    summary first): a failed run never reads as 'no stage misses its objectives'."""
    if not failures:
        return verdict
    said = "; ".join(f"{s} failed: {why}" for s, why in failures.items())
    return replace(verdict, summary=f"{said}. What was measured: {verdict.summary}")


def failure_lines(lines: list[str], failures: dict[str, str]) -> list[str]:
    """The verdict's lines (report.document.verdict_lines) with each failed stage's line
    saying 'failed: <why>'; what was measured of it, if anything, follows as 'measured: ...'."""
    out = list(lines)
    for stage, why in failures.items():
        head = f"{stage}: "
        at = next((i for i, ln in enumerate(out) if i > 0 and ln.startswith(head)), None)
        line = f"{stage}: {FAILED}: {why}"
        if at is None:
            out.append(line)
        elif out[at] == f"{stage}: not measured":
            out[at] = line
        else:
            out[at:at + 1] = [line, f"  measured: {out[at][len(head):]}"]
    return out
