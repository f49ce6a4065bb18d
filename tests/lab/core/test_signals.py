"""The typed signals of a record: records written with the old extras keys read into the typed
fields, the sheet and the limits read the fields, objectives on the old names keep working."""

import json
from pathlib import Path

from recordkit import rec
from scalelab.lab.core.economics import unit_costs
from scalelab.lab.core.limits import infer_limits
from scalelab.lab.core.objectives import metric_value
from scalelab.lab.core.records import Cost, Record, read_records
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.signals import Energy, Resources

OLD = {"cpu_busy_cores": 1.9, "comm_share": 0.4, "iowait_share": 0.25,
       "spilled_disk_bytes": 3 * 2**20, "server_peak_rss_bytes": 123_456_789,
       "series": "batching=on", "engine_scrapes": 3}


def test_a_record_written_with_the_old_extras_keys_reads_into_the_fields(tmp_path: Path) -> None:
    old = json.loads(rec("train", "workers", 2, rate=10.0).model_dump_json())
    # As schema version 1 wrote it before the typed fields: no series/resources keys at all.
    for key in ("series", "resources", "server"):
        del old[key]
    old["extras"] = dict(OLD)
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n", encoding="utf-8")
    (r,) = read_records(path)
    assert r.series == "batching=on"
    assert r.resources == Resources(cpu_busy_cores=1.9, comm_share=0.4, iowait_share=0.25,
                                    spilled_bytes=3 * 2**20, server_peak_rss_bytes=123_456_789)
    assert r.extras == {"engine_scrapes": 3}  # lifted, not read twice
    # Written again, it round-trips in the new shape.
    assert Record.model_validate_json(r.model_dump_json()) == r


def test_a_field_already_set_wins_over_an_old_key() -> None:
    r = rec("serve", "rate", 1, resources=Resources(cpu_busy_cores=0.5),
            extras={"cpu_busy_cores": 1.5})
    assert r.resources.cpu_busy_cores == 0.5 and "cpu_busy_cores" not in r.extras


def test_the_sheet_and_the_limits_read_the_fields_by_name() -> None:
    rows = build_sheet([rec("train", "workers", 2, rate=10.0,
                            resources=Resources(comm_share=0.4, cpu_busy_cores=1.9))])
    assert rows[0].resources.comm_share == 0.4
    assert rows[0].limiting_resource == "communication: 40% of step time"
    ev = infer_limits(rows, cores=2, memory_bytes=2**34)
    assert [e.resource for e in ev] == ["cpu", "communication"]
    assert ev[0].detail == "1.90 of 2 cores busy at workers=2"


def test_objectives_on_the_old_extras_names_read_the_fields() -> None:
    (row,) = build_sheet([rec("data", "rows", 1, resources=Resources(spilled_bytes=4096),
                              extras={"own": 7})])
    assert metric_value(row, "extras:spilled_disk_bytes") == 4096.0
    assert metric_value(row, "extras:cpu_busy_cores") is None
    assert metric_value(row, "extras:own") == 7.0


OLD_ENERGY = {"energy_j": 12.5, "energy_per_unit_j": 2.5, "energy_unit": "1k requests",
              "energy_basis": "measured (RAPL)"}
OLD_HISTS = {"hdr_histogram": "HISTlatency", "hdr_histograms": {"ttft": "HISTttft",
                                                                "itl": "HISTitl"}}


def test_old_energy_and_histogram_extras_read_into_the_fields(tmp_path: Path) -> None:
    old = json.loads(rec("serve", "rate", 40, rate=10.0).model_dump_json())
    # As schema version 1 wrote it before `energy` and `histograms`: no such keys at all.
    for key in ("energy", "histograms"):
        del old[key]
    old["extras"] = {**OLD_ENERGY, **OLD_HISTS, "own": 1}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n", encoding="utf-8")
    (r,) = read_records(path)
    assert r.schema_version == 1
    assert r.energy == Energy(joules=12.5, per_unit_j=2.5, unit="1k requests",
                              basis="measured (RAPL)")
    assert r.histograms == {"latency": "HISTlatency", "ttft": "HISTttft", "itl": "HISTitl"}
    assert r.extras == {"own": 1}  # lifted, not read twice
    assert Record.model_validate_json(r.model_dump_json()) == r


def test_typed_energy_and_histograms_win_over_old_keys() -> None:
    e = Energy(joules=1.0, basis="estimated (model: 3.5 W/core)")
    r = rec("serve", "rate", 1, energy=e, histograms={"latency": "NEW"},
            extras={**OLD_ENERGY, "hdr_histogram": "OLD"})
    assert r.energy == e and r.histograms == {"latency": "NEW"} and r.extras == {}


def test_the_sheet_economics_and_objectives_read_the_energy_field() -> None:
    e = Energy(joules=12.5, per_unit_j=2.5, unit="1k requests", basis="measured (RAPL)")
    (row,) = build_sheet([rec("serve", "rate", 40, energy=e,
                              cost=Cost(usd=0.5, per_unit_usd=0.1, unit="1k requests"),
                              extras={"cost_per_run_usd": 0.5})])
    assert (row.energy_j, row.energy_per_unit_j, row.energy_basis) == (
        12.5, 2.5, "measured (RAPL)")
    (u,) = unit_costs([row])
    assert (u.j_per_unit, u.j_per_run) == (2.5, 12.5)
    assert metric_value(row, "extras:energy_per_unit_j") == 2.5
    assert metric_value(row, "extras:energy_j") == 12.5
