"""Energy from the CPU the work was measured to use, not the core-seconds its cost reserves."""

from recordkit import rec
from scalelab.lab.core.energy import busy_basis, busy_core_seconds, record_energy
from scalelab.lab.core.records import Cost, Record


def _llm(**extras: object) -> Record:
    # A server priced as 2 reserved cores × 100 s at $0.036/core-hour = $0.002, over 4 units.
    return rec("llm", "concurrency", 10, wall_s=100.0, extras=extras,
               cost=Cost(usd=0.002, per_unit_usd=0.0005, unit="1k output tokens"))


def test_the_measured_busy_cpu_sets_the_energy() -> None:
    # 98 CPU seconds (0.98 of 2 cores busy): 98 × 3.5 = 343 J, not 200 core-s × 3.5 = 700 J.
    e = record_energy(_llm(server_cpu_s=98.0), core_hour_usd=0.036, watts_per_core=3.5)
    assert e is not None and (e.joules, e.per_unit_j) == (343.0, 85.75)
    assert e.basis == busy_basis(3.5) == "estimated (model: 3.5 W/core × measured busy CPU)"


def test_busy_cores_times_wall_when_no_cpu_seconds_were_kept() -> None:
    assert busy_core_seconds(_llm(cpu_busy_cores=0.5)) == 50.0
    assert busy_core_seconds(_llm(cpu_s=12.5, cpu_busy_cores=0.5)) == 12.5
    # Nothing measured: the charged core-seconds, labelled as the plain model.
    e = record_energy(_llm(), core_hour_usd=0.036, watts_per_core=3.5)
    assert e is not None and e.joules == 700.0 and e.basis == "estimated (model: 3.5 W/core)"
