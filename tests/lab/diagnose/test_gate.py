"""`--fail-on`: `scalelab report DIR` (and `diagnose`) exit 1 when the verdict's gate fails."""

from pathlib import Path

import pytest

from recordkit import M
from scalelab.cli import run
from scalelab.lab.core.records import Latency, append_records, make_record
from scalelab.lab.diagnose.stages import SECTIONS

OFF = ", ".join(f"{s.name}: {{enabled: false}}" for s in SECTIONS)


def _results(tmp_path: Path, objectives: str, samples: int | None) -> Path:
    """A results directory with three levels of a user's load stage and a config judging it."""
    out = tmp_path / "out"
    out.mkdir()
    lat = Latency(p50_ms=5, p90_ms=8, p95_ms=9, p99_ms=12, p999_ms=20, max_ms=30)
    extras = {} if samples is None else {"samples": samples}
    append_records(out / "records.jsonl", [
        make_record(experiment="t", stage="api", variable="rate", level=lvl, rate=lvl,
                    rate_unit="requests/s", latency=lat, failure_rate=0.0, machine=M,
                    input_volume=float(samples or 0), input_unit="requests", extras=extras)
        for lvl in (10.0, 20.0, 40.0)])
    (tmp_path / "cfg.yaml").write_text(f"""
repeats: 1
stages: {{{OFF}}}
custom:
  - name: api
    kind: load
    url: http://127.0.0.1:9/
    levels: [10, 20, 40]
    objectives: [{objectives}]
""")
    return out


def _report(tmp_path: Path, out: Path, *extra: str) -> int:
    return run(["report", str(out), "--config", str(tmp_path / "cfg.yaml"), "--json", *extra])


def test_gate_passes_when_every_check_is_met(tmp_path: Path) -> None:
    out = _results(tmp_path, "{metric: p95_ms, max: 50}, {metric: availability, min: 0.999}",
                   samples=3000)
    assert _report(tmp_path, out) == 0
    assert _report(tmp_path, out, "--fail-on", "miss") == 0
    assert _report(tmp_path, out, "--fail-on", "undecided") == 0


def test_a_miss_fails_both_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _results(tmp_path, "{metric: p95_ms, max: 5, label: \"p95 ≤ 5 ms\"}", samples=3000)
    capsys.readouterr()
    assert _report(tmp_path, out, "--fail-on", "miss") == 1
    assert capsys.readouterr().err.strip() == (
        "gate failed (--fail-on miss): api misses p95 ≤ 5 ms at 1×")
    assert _report(tmp_path, out, "--fail-on", "undecided") == 1
    assert _report(tmp_path, out) == 0  # no gate: the report is the answer


def test_undecided_fails_only_the_undecided_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1,180 requests a level without a failure cannot show 99.9% at 95%.
    out = _results(tmp_path, "{metric: availability, min: 0.999, label: \"availability ≥ 99.9%\"}",
                   samples=1180)
    capsys.readouterr()
    assert _report(tmp_path, out, "--fail-on", "miss") == 0
    assert _report(tmp_path, out, "--fail-on", "undecided") == 1
    assert capsys.readouterr().err.strip() == (
        "gate failed (--fail-on undecided): api undecided (undecided at 1×: availability ≥ "
        "99.9% needs 2,995 requests (measured 1,180); also undecided at 2×, 4×)")


def test_old_records_without_sample_counts_are_undecided(tmp_path: Path) -> None:
    out = _results(tmp_path, "{metric: p95_ms, max: 50}", samples=None)
    assert _report(tmp_path, out, "--fail-on", "miss") == 0
    assert _report(tmp_path, out, "--fail-on", "undecided") == 1


def test_bad_gate_value_is_usage(tmp_path: Path) -> None:
    out = _results(tmp_path, "{metric: p95_ms, max: 50}", samples=3000)
    assert _report(tmp_path, out, "--fail-on", "sometimes") == 2
