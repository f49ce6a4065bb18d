"""Unit economics for the weekly review: what one unit of each stage's work cost, in dollars and
in joules, at every measured level — from the sheet, so from the one price table.

A unit is the stage's own (1,000 predictions, 1k output tokens, 1000 queries, 1M rows, 1M
training samples); training also gets the cost of one whole run. Capacity-search steps and
other rows without a priced unit are left out: they measured no cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.lab.core.sheet import STAGE_ORDER, SheetRow


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    stage: str
    series: str
    variable: str
    level: float
    multiple: float
    unit: str
    usd_per_unit: float
    j_per_unit: float | None
    """None where the energy was neither measured nor estimable (e.g. GPU-priced work)."""
    energy_basis: str | None
    usd_per_run: float | None = None
    """The whole run's cost, where the record prices a run (training)."""
    j_per_run: float | None = None


def unit_costs(sheet: list[SheetRow]) -> list[UnitCost]:
    """One line per priced sheet row, in stage order (pure)."""
    out = []
    for r in sheet:
        if r.cost_per_unit_usd is None or not r.cost_unit:
            continue
        run_usd = r.extras.get("cost_per_run_usd")
        run_j = r.energy_j if run_usd is not None else None
        out.append(UnitCost(
            stage=r.stage, series=r.series, variable=r.variable, level=r.level,
            multiple=r.multiple, unit=r.cost_unit, usd_per_unit=r.cost_per_unit_usd,
            j_per_unit=r.energy_per_unit_j, energy_basis=r.energy_basis,
            usd_per_run=float(run_usd) if isinstance(run_usd, int | float) else None,
            j_per_run=float(run_j) if isinstance(run_j, int | float) else None))
    return sorted(out, key=lambda u: (STAGE_ORDER.get(u.stage, len(STAGE_ORDER)), u.stage,
                                      u.series, u.level))


def _joules(j: float | None) -> str:
    if j is None:
        return "energy not measured"
    if j >= 3.6e6:
        return f"{j / 3.6e6:.3g} kWh"
    if j >= 1e3:
        return f"{j / 1e3:.3g} kJ"
    return f"{j:.3g} J"


def review_lines(costs: list[UnitCost]) -> list[str]:
    """The weekly review as sentences, one per stage and series (pure):
    'serve batching=on: $2.97e-05 and 0.21 J / 1,000 predictions at rate 40, ...'."""
    groups: dict[tuple[str, str], list[UnitCost]] = {}
    for u in costs:
        groups.setdefault((u.stage, u.series), []).append(u)
    lines = []
    for (stage, series), us in groups.items():
        parts = []
        for i, u in enumerate(us):
            what = f"${u.usd_per_unit:.3g} and {_joules(u.j_per_unit)}"
            if i == 0:
                what += f" / {u.unit}"
            if u.usd_per_run is not None:
                what += f" (one run: ${u.usd_per_run:.3g}, {_joules(u.j_per_run)})"
            parts.append(f"{what} at {u.variable} {u.level:g}")
        bases = sorted({u.energy_basis for u in us if u.energy_basis})
        name = f"{stage} {series}" if series else stage
        lines.append(f"{name}: {', '.join(parts)}" + (f" [{'; '.join(bases)}]" if bases else ""))
    return lines
