"""Energy: the model's exact numbers, RAPL over a fake powercap tree (real files), the counter's
wrap-around, energy per unit from a record's cost, and the diagnose runner's tagger."""

from __future__ import annotations

from pathlib import Path

import pytest

from recordkit import rec
from scalelab.lab.core.energy import (
    MEASURED,
    RaplMeter,
    counter_delta,
    estimate_joules,
    estimated_basis,
    rapl_zones,
    record_energy,
    share_by_core_seconds,
    with_energy,
)
from scalelab.lab.core.records import Cost, Record, append_records
from scalelab.lab.diagnose.energy import EnergyTagger
from scalelab.lab.diagnose.schema import Prices

MAX = 262_143_328_850  # a real package's max_energy_range_uj


def zone(root: Path, name: str, label: str, energy: int, max_range: int = MAX) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    (d / "energy_uj").write_text(f"{energy}\n")
    return d


def test_the_model_is_core_seconds_times_watts() -> None:
    assert estimate_joules(2.5, 3.5) == 8.75
    assert estimate_joules(3600.0, 4.0) == 14400.0
    assert estimated_basis(3.5) == "estimated (model: 3.5 W/core)"
    with pytest.raises(ValueError):
        estimate_joules(-1.0, 3.5)


def test_counter_wraps_at_its_max_range() -> None:
    assert counter_delta(1_000, 4_500, MAX) == 3_500
    assert counter_delta(MAX - 100, 50, MAX) == 150
    assert counter_delta(7, 7, MAX) == 0


def test_rapl_meter_sums_packages_not_their_subzones(tmp_path: Path) -> None:
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 999_000, max_range=1_000_000)
    zone(tmp_path, "intel-rapl:0:0", "core", 10)  # inside package-0: never added again
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 5_000)
    assert [z.name for z in rapl_zones(tmp_path)] == ["package-0", "package-1"]
    meter = RaplMeter(tmp_path).start()
    assert meter.available
    (p0 / "energy_uj").write_text("500\n")  # wrapped: 1,000 to the top, then 500
    (p1 / "energy_uj").write_text("7000\n")
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("900000\n")
    assert meter.stop() == 0.0035  # (1,500 + 2,000) µJ


def test_no_readable_rapl_means_no_measurement(tmp_path: Path) -> None:
    assert RaplMeter(tmp_path / "absent").start().stop() is None
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "max_energy_range_uj").write_text(f"{MAX}\n")
    (d / "energy_uj").mkdir()  # unreadable as a file (root reads any mode, so not chmod)
    meter = RaplMeter(tmp_path).start()
    assert not meter.available and meter.stop() is None


def _priced(usd: float, per_unit: float, unit: str = "1,000 predictions",
            **kw: object) -> Record:
    return rec("serve", "rate", 40, cost=Cost(usd=usd, per_unit_usd=per_unit, unit=unit), **kw)


def test_energy_per_unit_from_the_core_seconds_the_cost_charges() -> None:
    # $0.096 at $0.048 per core-hour is 2 core-hours = 7,200 core-seconds, over 4 units
    r = _priced(0.096, 0.024)
    e = record_energy(r, core_hour_usd=0.048, watts_per_core=3.5)
    assert e is not None
    assert e.joules == 25_200.0
    assert e.per_unit_j == 6_300.0
    assert (e.unit, e.basis) == ("1,000 predictions", "estimated (model: 3.5 W/core)")
    m = record_energy(r, core_hour_usd=0.048, watts_per_core=3.5, measured_j=100.0)
    assert m is not None and (m.joules, m.per_unit_j, m.basis) == (100.0, 25.0, MEASURED)
    tagged = with_energy(r, core_hour_usd=0.048, watts_per_core=3.5)
    assert tagged.energy == e


def test_no_energy_without_a_priced_unit_or_for_accelerator_work() -> None:
    bare = rec("serve", "rate", 40)
    assert record_energy(bare, core_hour_usd=0.048, watts_per_core=3.5) is None
    assert with_energy(bare, core_hour_usd=0.048, watts_per_core=3.5) is bare
    gpu = _priced(0.096, 0.024, extras={"device": "cuda"})
    assert record_energy(gpu, core_hour_usd=0.048, watts_per_core=3.5) is None
    assert record_energy(_priced(0.096, 0.024), core_hour_usd=0.0, watts_per_core=3.5) is None


def test_measured_joules_are_shared_by_core_seconds() -> None:
    assert share_by_core_seconds(8.0, [1.0, 3.0, None]) == [2.0, 6.0, None]
    assert share_by_core_seconds(8.0, [None, 0.0]) == [None, None]


def test_runner_tagger_uses_rapl_when_readable_else_the_model(tmp_path: Path) -> None:
    prices = Prices(core_hour_usd=0.036, watts_per_core=3.5)
    records = tmp_path / "step.jsonl"
    # two levels of one step: 1 and 3 core-seconds charged ($0.036/h = $0.00001 per core-s)
    unit = "1,000 predictions"
    a = rec("serve", "rate", 40, cost=Cost(usd=1e-5, per_unit_usd=1e-6, unit=unit))
    b = rec("serve", "rate", 80, cost=Cost(usd=3e-5, per_unit_usd=1e-6, unit=unit))
    append_records(records, [a, b])
    root = tmp_path / "powercap"
    p0 = zone(root, "intel-rapl:0", "package-0", 1_000_000)
    tagger = EnergyTagger(None, prices, records, root=root)
    (p0 / "energy_uj").write_text("9000000\n")  # 8 J over the step
    ta, tb = tagger(a), tagger(b)
    # the core-seconds come from dollars, so the split is exact to float rounding
    assert ta.energy is not None and tb.energy is not None
    assert [ta.energy.joules, tb.energy.joules] == pytest.approx([2.0, 6.0], rel=1e-12)
    assert ta.energy.basis == MEASURED
    assert tb.energy.per_unit_j == pytest.approx(0.2, rel=1e-12)  # 6 J / 30 units
    model = EnergyTagger(None, prices, records, root=tmp_path / "none")(b).energy
    assert model is not None
    assert model.joules == pytest.approx(10.5, rel=1e-12)  # 3 core-s × 3.5 W
    assert model.basis == "estimated (model: 3.5 W/core)"


def test_a_one_record_step_priced_by_its_stage_gets_all_the_joules(tmp_path: Path) -> None:
    prices = Prices(core_hour_usd=0.036, watts_per_core=3.5)
    records = tmp_path / "level.jsonl"
    raw = rec("serve", "rate", 40)  # the load generator's record: the stage's tagger prices it
    append_records(records, [raw])
    root = tmp_path / "powercap"
    p0 = zone(root, "intel-rapl:0", "package-0", 0)

    def price(r: Record) -> Record:
        return r.model_copy(update={"cost": Cost(usd=1e-5, per_unit_usd=2e-6, unit="1,000 "
                                                 "predictions")})

    tagger = EnergyTagger(price, prices, records, root=root)
    (p0 / "energy_uj").write_text("4000000\n")  # 4 J over the level
    tagged = tagger(raw)
    assert tagged.energy is not None
    assert (tagged.energy.joules, tagged.energy.basis) == (4.0, MEASURED)
    assert tagged.energy.per_unit_j == pytest.approx(0.8, rel=1e-12)  # over 5 units
