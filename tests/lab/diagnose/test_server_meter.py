"""The serve stage's reading of `load run --server-pid`'s meter (`serve_meter.metered`): busy
cores over the offered time, the tree's peak as the record's peak memory, the cost of 1,000
predictions from the CPU seconds and the responses the server counted."""

from recordkit import rec
from scalelab.lab.core.records import Record
from scalelab.lab.diagnose.stages.serve_meter import RECOVERY_REFERENCE, metered

NOWHERE = "http://127.0.0.1:9"  # nothing listens: no governance to read


def _chunk(**extras: object) -> Record:
    r = rec("serve", "rate", 40, wall_s=2.0)
    # Validated again: server_peak_rss_bytes is lifted into resources, as `load run` writes it.
    return Record.model_validate({**r.model_dump(), "extras": {**r.extras, **extras}})


def test_the_readings_become_busy_cores_peak_memory_and_cost() -> None:
    got = metered(_chunk(server_cpu_s=0.6, server_responses=120.0,
                         server_peak_rss_bytes=350_000_000),
                  url=NOWHERE, core_hour_usd=0.048)
    assert got.resources.cpu_busy_cores == 0.6 / 3.0  # 2 s window + 1 s warm-up offered
    assert got.peak_memory_bytes == 350_000_000
    assert "server_peak_rss_bytes" not in got.extras
    assert got.recovery == RECOVERY_REFERENCE
    assert got.cost is not None and got.cost.unit == "1,000 predictions"
    usd = 0.6 / 3600.0 * 0.048
    assert got.cost.usd == usd and got.cost.per_unit_usd == usd / 120.0 * 1000.0


def test_no_responses_counted_means_no_cost() -> None:
    got = metered(_chunk(server_cpu_s=0.2, server_responses=0.0, server_peak_rss_bytes=10),
                  url=NOWHERE, core_hour_usd=0.048)
    assert got.cost is None and "server_responses" not in got.extras
    assert got.resources.cpu_busy_cores == 0.2 / 3.0


def test_a_record_without_readings_stays_unmetered() -> None:
    got = metered(_chunk(), url=NOWHERE, core_hour_usd=0.048)
    assert got.resources.cpu_busy_cores is None and got.cost is None
    assert got.peak_memory_bytes is None
