"""Failed stages: a step that could not measure (refused connections, a server that never
started, every request an error) fails its stage, in the verdict, the report and the exit code.

A failed step is not a miss: the system under test did not answer, so no objective was judged
there. The verdict core knows only what the records measured; this module adds what the run
itself knows (run.json's failed steps) and what the records say of a stage whose every request
failed; `core.verdict.judge` takes them as an input, so "no stage misses its objectives" never
reads over a stage that never answered.
"""

from __future__ import annotations

from typing import Any

from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.units import format_multiple


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
            levels = ", ".join(format_multiple(m) for m in sorted({r.multiple for r in rows}))
            out.setdefault(stage, []).append(
                f"every request failed at every level measured ({levels})")
    return {
        s: whys[0] + (f" (and {len(whys) - 1} more failed step(s); see run.json)"
                      if len(whys) > 1 else "")
        for s, whys in out.items()
    }
