"""Live progress: drawn on a terminal's stderr, never on a pipe, never into --json's stdout."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.cli._progress import live_progress, shown


def _sweep(tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "scalelab", "sweep", "--var", "n=1,2", "--records",
            str(tmp_path / "r.jsonl"), "--json", "--", sys.executable, "-c",
            "import sys, time; time.sleep(0.2 * float(sys.argv[1]))", "{n}"]


# The helper alone, as a command uses it (no scalelab start-up: the same rule, seconds cheaper).
HELPER = [sys.executable, "-c", "import time\n"
          "from scalelab.cli._progress import live_progress\n"
          "with live_progress('work', total=2) as p:\n"
          "    p.advance('step one'); time.sleep(0.3); p.advance('step two')\n"
          "print('done')"]


def _read_all(master: int) -> bytes:
    seen = b""
    while select.select([master], [], [], 0)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SCALELAB_NO_PROGRESS", "FORCE_COLOR", "TTY_INTERACTIVE", "NO_COLOR")}
    env["TERM"] = "xterm"
    return env


def test_a_terminal_sees_the_bar_and_stdout_holds_only_the_json(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(_sweep(tmp_path), stdout=subprocess.PIPE, stderr=slave,
                            env=_env())
    os.close(slave)
    seen = b""
    while True:  # drain the terminal while the command runs (a full pty would block it)
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0
    assert json.loads(out)["variable"] == "n"  # one JSON document, nothing else
    assert b"sweep n" in seen or b"n=1" in seen


def test_a_pipe_gets_no_bar() -> None:
    p = subprocess.run(HELPER, capture_output=True, text=True, env=_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "done\n" and p.stderr == ""


def test_captured_output_gets_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert not shown()
    with live_progress("work", total=2) as progress:
        progress.advance("one")
        progress.update(completed=2, note="two")
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == ""


def test_the_helper_draws_on_a_terminal_unless_scalelab_no_progress() -> None:
    for off, env in ((False, _env()), (True, {**_env(), "SCALELAB_NO_PROGRESS": "1"})):
        master, slave = pty.openpty()
        proc = subprocess.Popen(HELPER, stdout=subprocess.PIPE, stderr=slave, env=env)
        os.close(slave)
        out, _ = proc.communicate(timeout=60)
        seen = _read_all(master)
        os.close(master)
        assert proc.returncode == 0 and out == b"done\n"
        assert (b"step" in seen) is not off, seen
