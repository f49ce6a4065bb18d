"""The CLI as the tests call it in-process: a command's one JSON document, or its one-line
usage error (exit 2, no traceback)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scalelab.cli import run


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """`args` with --json: exit 0 and exactly one JSON document on stdout."""
    rc = run([*args, "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)  # exactly one document: json.loads rejects trailing text


def fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`args` refused as bad usage: exit 2 and one line on stderr, `error: ...`; that line."""
    rc = run(list(args))
    cap = capsys.readouterr()
    assert rc == 2, cap
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), cap.err
    assert "Traceback" not in cap.err
    return lines[0]
