"""--output FILE.csv|FILE.json on the commands that print a table, and schema_version."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.cli._export import table_rows, write_output
from scalelab.lab.core.serialize import with_schema


def test_csv_rows_flatten_flat_objects_and_keep_deeper_ones_as_json(tmp_path: Path) -> None:
    doc = {"levels": [{"rate": 1.0, "latency": {"p50_ms": 2.5, "p99_ms": 9.0},
                       "errors": {"timeout": 1}, "budget": [{"met": True}]},
                      {"rate": 2.0, "extra": "x"}]}
    out = tmp_path / "t.csv"
    write_output(out, doc, lambda: table_rows(doc))
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["rate", "latency.p50_ms", "latency.p99_ms", "errors.timeout",
                             "budget", "extra"]
    assert rows[0]["latency.p50_ms"] == "2.5" and rows[0]["budget"] == '[{"met":true}]'
    assert rows[1] == {"rate": "2.0", "latency.p50_ms": "", "latency.p99_ms": "",
                       "errors.timeout": "", "budget": "", "extra": "x"}
    js = tmp_path / "t.json"
    write_output(js, doc, lambda: table_rows(doc))
    assert json.loads(js.read_text()) == {"schema_version": 1, **doc}
    assert table_rows({"steps": [{"a": 1}]}) == [{"a": 1}]
    # No table key: the first list of objects, else the document as one row.
    assert table_rows({"x": 1, "n": [2], "items": [{"a": 2}]}) == [{"a": 2}]
    assert table_rows({"x": 1, "n": [2]}) == [{"x": 1, "n": [2]}] and table_rows([1]) == []
    # A file in a format of its own (a data schema) keeps its version there, no other key.
    own = {"format": "scalelab.schema/1", "columns": []}
    assert with_schema(own) == own and with_schema({"a": 1}) == {"schema_version": 1, "a": 1}


def test_load_run_writes_its_levels_and_every_json_has_a_schema_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Ok(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/"
        out = tmp_path / "levels.csv"
        assert run(["load", url, "--rates", "20,40", "--arrival", "constant", "--duration", "0.5s",
                    "--warmup", "0s",
                    "--output", str(out), "--plot", str(tmp_path / "l.png"), "--json"]) == 0
        assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
        doc = json.loads(capsys.readouterr().out)
        assert doc["schema_version"] == 1
        rows = list(csv.DictReader(out.open()))
        assert [float(r["offered_rps"]) for r in rows] == [20.0, 40.0]
        assert [int(r["latency.count"]) for r in rows] == [10, 20]
    finally:
        srv.shutdown()
    assert run(["load", url, "--rate", "1", "--output", str(tmp_path / "x.xlsx")]) == 2


def test_report_writes_the_diagnostic_sheet(tmp_path: Path, serve_records: list,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from scalelab.lab.core.records import append_records
    from scalelab.lab.core.sheet import series_of

    append_records(tmp_path / "records.jsonl", serve_records)
    out = tmp_path / "sheet.csv"
    run(["report", str(tmp_path), "--output", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len({(r.stage, series_of(r), r.level) for r in serve_records})
    assert {r["stage"] for r in rows} == {r.stage for r in serve_records}
    assert "p95_ms" in rows[0]


def test_every_command_with_json_takes_output() -> None:
    """One shared option (`give_output`), not a copy per command: every command the CLI loads
    that prints a --json document also writes it, or its table, with --output."""
    import click

    from scalelab.cli import all_commands

    def leaves(cmd: click.Command, path: str) -> list[tuple[str, click.Command]]:
        if isinstance(cmd, click.Group):
            return [x for n, c in cmd.commands.items() for x in leaves(c, f"{path} {n}")]
        return [(path, cmd)]

    found = [(p, c) for n, cmd in all_commands().items() for p, c in leaves(cmd, n)]
    with_json = [p for p, c in found if any(x.name == "as_json" for x in c.params)]
    assert len(with_json) > 40
    assert [p for p, c in found if p in with_json
            and not any(x.name == "output" for x in c.params)] == []


def test_commands_without_their_own_option_write_csv_and_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "amdahl.csv"
    assert run(["plan", "amdahl", "--parallel-fraction", "0.5", "--workers", "1,2",
                "--output", str(out)]) == 0
    assert out.read_text() == "workers,speedup,efficiency\n1.0,1.0,1.0\n" \
        "2.0,1.3333333333333333,0.6666666666666666\n"
    (tmp_path / "u.csv").write_text("workers,rps\n1,100\n2,190\n4,340\n8,520\n16,600\n")
    js, models = tmp_path / "usl.json", tmp_path / "models.csv"
    assert run(["fit", "usl", "--csv", str(tmp_path / "u.csv"), "--output", str(js)]) == 0
    capsys.readouterr()
    assert run(["fit", "usl", "--csv", str(tmp_path / "u.csv"), "--output", str(models),
                "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert json.loads(js.read_text()) == doc
    assert [r["model"] for r in csv.DictReader(models.open())] == ["linear", "amdahl", "usl"]
    assert run(["plan", "lr", "--base-lr", "0.1", "--base-batch", "256", "--batch", "512",
                "--output", str(tmp_path / "lr.txt")]) == 2
    assert "ending in .csv or .json" in capsys.readouterr().err
