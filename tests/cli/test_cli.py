"""The CLI conventions: --help everywhere, --json is one document, bad input exits 2 in one line."""

import json
import sys
from pathlib import Path

import click
import pytest

from scalelab.cli import all_commands, app, run


def _walk(cmd: click.Command, path: list[str]) -> list[list[str]]:
    out = [path]
    if isinstance(cmd, click.Group):
        subs = all_commands() if cmd is app else cmd.commands
        for name, sub in sorted(subs.items()):
            out += _walk(sub, [*path, name])
    return out


COMMANDS = _walk(app, [])


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "scalelab" for p in COMMANDS])
def test_every_command_has_help(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage:" in out


def test_plan_amdahl_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["plan", "amdahl", "--parallel-fraction", "0.95", "--workers", "1,8,64,512", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    rows = [
        (r["workers"], round(r["speedup"], 1), round(100 * r["efficiency"])) for r in data["rows"]
    ]
    assert rows == [(1, 1.0, 100), (8, 5.9, 74), (64, 15.4, 24), (512, 19.3, 4)]
    assert data["limit"] == pytest.approx(20.0)


def test_plan_amdahl_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "amdahl", "-p", "0.95", "--workers", "8"]) == 0
    out = capsys.readouterr().out
    assert "5.9×" in out and "74%" in out and "20.0×" in out


def test_gustafson_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "gustafson", "-p", "0.9", "--workers", "1,10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["speedup"] for r in data["rows"]] == pytest.approx([1.0, 9.1])
    assert data["limit"] is None  # unbounded: JSON has no infinity


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "amdahl", "--parallel-fraction", "1.5"], "between 0 and 1"),
        (["plan", "amdahl", "--parallel-fraction", "x"], "not a valid float"),
        (["plan", "amdahl"], "Missing option"),
        (["plan", "amdahl", "-p", "0.9", "--workers", "1,two"], "'two' is not a number"),
        (["plan", "amdahl", "-p", "0.9", "--bogus"], "No such option"),
        (["plan", "nope"], "No such command"),
        (["fit", "usl"], "exactly one of --csv"),
        (["fit", "usl", "--csv", "/nonexistent.csv"], "does not exist"),
        (["sweep", "--var", "workers", "--", "true"], "NAME=LEVELS"),
        (["sweep", "--var", "n=1", "--timeout", "soon", "--", "true"], "not a duration"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = [ln for ln in cap.err.strip().splitlines() if ln.strip()]
    assert len(" ".join(lines)) < 400 and "Traceback" not in cap.err
    assert needle in " ".join(lines)


def test_fit_usl_from_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "t.csv"
    # X = 10N / (1 + 0.1(N−1) + 0.01N(N−1)) at N = 1..8, exactly.
    rows = ["workers,rps"]
    for n in range(1, 9):
        rows.append(f"{n},{10 * n / (1 + 0.1 * (n - 1) + 0.01 * n * (n - 1))!r}")
    csv.write_text("\n".join(rows) + "\n")
    assert run(["fit", "usl", "--csv", str(csv), "--x", "workers", "--y", "rps", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == "usl"
    assert data["usl"]["alpha"]["value"] == pytest.approx(0.1, rel=1e-6)
    assert data["usl"]["beta"]["value"] == pytest.approx(0.01, rel=1e-6)
    assert data["usl"]["n_peak"] == pytest.approx((0.9 / 0.01) ** 0.5, rel=1e-6)


def test_fit_usl_malformed_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text("n,x\n1,10\n2,abc\n")
    assert run(["fit", "usl", "--csv", str(csv)]) == 2
    assert "bad.csv:3" in capsys.readouterr().err


def test_sweep_json_and_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "rec.jsonl"
    assert (
        run(
            [
                "sweep",
                "--var",
                "n=1,2,4",
                "--records",
                str(records),
                "--json",
                "--",
                sys.executable,
                "-c",
                "import sys; print('rate=%d' % (5 * int(sys.argv[1])))",
                "{n}",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [lv["level"] for lv in data["levels"]] == [1.0, 2.0, 4.0]
    assert len(records.read_text().splitlines()) == 3

    assert (
        run(
            [
                "sweep",
                "--var",
                "n=1,2,4",
                "--metric",
                r"rate=(\d+)",
                "--records",
                str(records),
                "--json",
                "--",
                sys.executable,
                "-c",
                "import sys; print('rate=%d' % (5 * int(sys.argv[1])))",
                "{n}",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [lv["throughput_median"] for lv in data["levels"]] == [5.0, 10.0, 20.0]
    assert data["fit"]["chosen"] == "linear"


def test_sweep_where_every_run_fails_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run(
            [
                "sweep",
                "--var",
                "n=1",
                "--records",
                str(tmp_path / "r.jsonl"),
                "--",
                sys.executable,
                "-c",
                "raise SystemExit(4)",
            ]
        )
        == 2
    )
    assert "every run of the command failed" in capsys.readouterr().err
