"""Energy per unit of work: measured from RAPL counters where the kernel lets us read them,
else estimated by an explicit model, and always labelled with which.

The model: energy = core-seconds × watts per core. The default, 3.5 W per vCPU at full load,
is the Cloud Carbon Footprint methodology's AWS coefficient (Appendix I, "Average Maximum Watts
(100% CPU Utilization): 3.5", derived from SPECpower results of the CPUs AWS runs; the
methodology's idle figure is 0.74 W). A busy core-second is charged the full-load figure, so the
estimate covers the cores' share of the package, not memory, disks, fans or the building (no
PUE). Results read "estimated (model: 3.5 W/core)".

The measurement: Intel RAPL through the Linux powercap interface,
/sys/class/powercap/intel-rapl:N/energy_uj (one package per N; its sub-zones intel-rapl:N:M are
parts of the package and are not added again). The counter wraps at max_energy_range_uj; a
reading below the previous one has wrapped once (an interval shorter than a wrap — minutes at
package power — is assumed). Since Linux 5.10 energy_uj is readable only by root on most
distributions (a side channel, CVE-2020-8694), and most virtual machines expose no powercap at
all: then the model applies. RAPL counts the whole package: every process on it, not only the
measured work. Results read "measured (RAPL)".

Everything here but the reader is pure; the reader takes its root so tests build a fake tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.records import Record
from scalelab.lab.core.signals import Energy

DEFAULT_WATTS_PER_CORE = 3.5
"""Watts of one busy vCPU (Cloud Carbon Footprint's AWS average maximum)."""
POWERCAP = Path("/sys/class/powercap")
MEASURED = "measured (RAPL)"


def estimated_basis(watts_per_core: float) -> str:
    return f"estimated (model: {watts_per_core:g} W/core)"


def busy_basis(watts_per_core: float) -> str:
    return f"estimated (model: {watts_per_core:g} W/core × measured busy CPU)"


def estimate_joules(core_seconds: float, watts_per_core: float) -> float:
    """The model: core-seconds × watts per core (pure)."""
    if core_seconds < 0 or watts_per_core <= 0:
        raise ValueError("core-seconds must be >= 0 and watts per core > 0")
    return core_seconds * watts_per_core


def counter_delta(before: int, after: int, max_range: int) -> int:
    """Microjoules between two readings of a counter that wraps at `max_range` (pure)."""
    if after >= before:
        return after - before
    return max_range - before + after


@dataclass(frozen=True, kw_only=True)
class RaplZone:
    name: str
    """The package's name as the kernel gives it (e.g. "package-0")."""
    energy: Path
    max_range_uj: int


def rapl_zones(root: Path = POWERCAP) -> list[RaplZone]:
    """The readable RAPL packages under `root`; empty where there are none or reading is
    refused (then energy is estimated)."""
    zones = []
    for d in sorted(root.glob("intel-rapl:*")):
        if d.name.count(":") != 1:  # a sub-zone (core, uncore, dram) inside a package
            continue
        try:
            max_range = int((d / "max_energy_range_uj").read_text().strip())
            int((d / "energy_uj").read_text().strip())
            name = (d / "name").read_text().strip() if (d / "name").exists() else d.name
        except (OSError, ValueError):
            continue
        zones.append(RaplZone(name=name, energy=d / "energy_uj", max_range_uj=max_range))
    return zones


def read_counters(zones: list[RaplZone]) -> list[int] | None:
    try:
        return [int(z.energy.read_text().strip()) for z in zones]
    except (OSError, ValueError):
        return None


class RaplMeter:
    """Joules of all packages between `start()` and `stop()`; `stop()` is None when RAPL is not
    readable here (or stopped being readable)."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.zones = rapl_zones(root)
        self._before: list[int] | None = None
        self.started_at = 0.0

    @property
    def available(self) -> bool:
        return bool(self.zones)

    def start(self) -> RaplMeter:
        self._before = read_counters(self.zones) if self.zones else None
        self.started_at = time.monotonic()
        return self

    def stop(self) -> float | None:
        if self._before is None:
            return None
        after = read_counters(self.zones)
        if after is None:
            return None
        uj = sum(counter_delta(b, a, z.max_range_uj)
                 for b, a, z in zip(self._before, after, self.zones, strict=True))
        return uj / 1e6


def charged_core_seconds(r: Record, core_hour_usd: float) -> float | None:
    """The core-seconds a record's cost charges at the core price (pure): every stage prices
    its work as core-seconds × the one core price, so energy and cost share one basis. None
    without a cost, with a zero price, or for work priced on an accelerator."""
    device = str(r.extras.get("device") or r.machine.device)
    if r.cost is None or core_hour_usd <= 0 or not device.startswith("cpu"):
        return None
    return r.cost.usd / core_hour_usd * 3600.0


BUSY_CPU_KEYS = ("server_cpu_s", "cpu_s")
"""Record extras holding the CPU seconds (user + system) the work's process tree measured: a
server's over the level, or the stage's own process and its children."""


def busy_core_seconds(r: Record) -> float | None:
    """The CPU seconds a record's work measured (pure): `BUSY_CPU_KEYS`, else busy cores ×
    the record's wall time; None where the record measured no CPU, or for accelerator work."""
    device = str(r.extras.get("device") or r.machine.device)
    if not device.startswith("cpu"):
        return None
    for key in BUSY_CPU_KEYS:
        v = r.extras.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
            return float(v)
    busy = r.resources.cpu_busy_cores
    if busy is not None and r.wall_s:
        return float(busy) * r.wall_s
    return None


def record_energy(r: Record, *, core_hour_usd: float, watts_per_core: float,
                  measured_j: float | None = None) -> Energy | None:
    """Energy of one record from its cost (pure): the model on the core-seconds its cost
    charges, or `measured_j` when RAPL measured this record's work; per unit of the cost's
    unit (units = cost / cost per unit). None where the record has no priced unit."""
    c = r.cost
    if c is None or not c.unit or not c.per_unit_usd or c.usd <= 0:
        return None
    units = c.usd / c.per_unit_usd
    if measured_j is not None:
        return Energy(joules=measured_j, per_unit_j=measured_j / units, unit=c.unit,
                      basis=MEASURED)
    # The CPU the work was measured to use, where it was: the core-seconds its cost charges
    # may be every core of the machine × wall time (a reserved server), 2x the busy CPU at
    # 0.98 of 2 cores busy.
    busy = busy_core_seconds(r)
    if busy is not None:
        j = estimate_joules(busy, watts_per_core)
        return Energy(joules=j, per_unit_j=j / units, unit=c.unit,
                      basis=busy_basis(watts_per_core))
    core_s = charged_core_seconds(r, core_hour_usd)
    if core_s is None:
        return None
    j = estimate_joules(core_s, watts_per_core)
    return Energy(joules=j, per_unit_j=j / units, unit=c.unit,
                  basis=estimated_basis(watts_per_core))


def with_energy(r: Record, *, core_hour_usd: float, watts_per_core: float,
                measured_j: float | None = None) -> Record:
    """The record with its `energy` (unchanged where it has no priced unit)."""
    e = record_energy(r, core_hour_usd=core_hour_usd, watts_per_core=watts_per_core,
                      measured_j=measured_j)
    if e is None:
        return r
    return r.model_copy(update={"energy": e})


def share_by_core_seconds(joules: float, core_seconds: list[float | None]) -> list[float | None]:
    """Split one interval's measured joules over the records measured in it, in proportion to
    the core-seconds each charged (pure); None for a record that charged none."""
    total = sum(c for c in core_seconds if c)
    if total <= 0:
        return [None] * len(core_seconds)
    return [joules * c / total if c else None for c in core_seconds]
