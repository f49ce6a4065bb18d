"""The sweep runs real subprocesses and measures them."""

import sys
from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.sweep import SweepConfig, parse_metric, run_once, run_sweep, substitute

PY = sys.executable


def test_substitute_and_metric_parsing() -> None:
    assert substitute(["job", "--n={workers}", "x"], "workers", 4.0) == ["job", "--n=4", "x"]
    assert substitute(["{s}"], "s", 0.5) == ["0.5"]
    assert parse_metric(r"rate: ([0-9.]+)", "rate: 1\nrate: 2.5\n") == 2.5
    assert parse_metric("json:stats.rps", 'noise\n{"stats": {"rps": 12}}\n') == 12.0
    assert parse_metric("json:missing", '{"a": 1}') is None
    # A whole indented JSON document, as `scalelab ... --json` prints it.
    assert parse_metric("json:rows_per_s", '{\n  "rows_per_s": 5.5,\n  "x": [1]\n}\n') == 5.5
    assert parse_metric(r"rate: ([0-9.]+)", "nothing here") is None


def test_run_once_measures_cpu_and_memory_of_the_tree() -> None:
    # A child that allocates ~60 MiB and burns CPU; its grandchild is counted in the tree too.
    code = (
        "import subprocess, sys; b = bytearray(60 * 2**20); "
        "subprocess.run([sys.executable, '-c', 'sum(range(3_000_000))']); "
        "sum(i * i for i in range(2_000_000)); print('done')"
    )
    r = run_once([PY, "-c", code], timeout_s=60)
    assert r.ok and r.exit_code == 0
    assert r.peak_rss_bytes > 60 * 2**20
    assert r.cpu_s > 0 and r.wall_s > 0
    assert "done" in r.stdout_tail


def test_timeout_kills_the_process_group() -> None:
    r = run_once([PY, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert r.timed_out and not r.ok and r.exit_code is None


def test_sweep_records_failures_and_fits_the_rest(tmp_path: Path) -> None:
    # Level 3 fails; the others print a rate proportional to the level (perfect scaling).
    script = tmp_path / "job.py"
    script.write_text(
        "import sys\nn = int(sys.argv[1])\n"
        "if n == 3:\n    sys.exit(3)\n"
        "print('{\"rate\": %d}' % (10 * n))\n"
    )
    cfg = SweepConfig(
        variable="workers",
        levels=[1, 2, 3, 4],
        command=[PY, str(script), "{workers}"],
        repeats=2,
        metric="json:rate",
        experiment="t",
    )
    res = run_sweep(cfg)
    assert len(res.records) == 8
    failed = [r for r in res.records if not r.ok]
    assert {r.level for r in failed} == {3.0} and len(failed) == 2
    assert failed[0].error is not None and "exit status 3" in failed[0].error
    assert res.fit is not None
    assert res.fit.levels == [1.0, 2.0, 4.0]
    assert res.fit.throughput == [10.0, 20.0, 40.0]
    assert res.fit.chosen == "linear"
    assert all(r.stage == "sweep" and r.variable == "workers" for r in res.records)


def test_missing_metric_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    cfg = SweepConfig(
        variable="n", levels=[1], command=[PY, "-c", "print('hi')"], metric=r"rps=(\d+)"
    )
    res = run_sweep(cfg)
    assert not res.records[0].ok and "not found" in (res.records[0].error or "")
    assert res.fit is None and res.fit_error is not None


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"variable": "bad name"}, "identifier"),
        ({"levels": []}, "at least one level"),
        ({"command": []}, "no command"),
        ({"repeats": 0}, "repeats"),
        ({"metric": "no-group"}, "capture group"),
        ({"metric": "(unclosed"}, "not a valid regex"),
    ],
)
def test_config_validation(kwargs: dict[str, object], msg: str) -> None:
    base: dict[str, object] = {"variable": "n", "levels": [1.0], "command": ["true"]}
    base.update(kwargs)
    with pytest.raises(BadUsageError, match=msg):
        SweepConfig(**base)  # type: ignore[arg-type]
