"""The engine's OpenMP threads wait passively (system/generate/threads.py): the pure choice, and
what libgomp itself reports it read in the process `scalelab generate` runs the engine in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scalelab.layers.web.spawn import start_server
from scalelab.system.generate.threads import WAIT_VARS, passive_wait, wait_env


def test_passive_unless_the_user_chose() -> None:
    assert wait_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_env({"PATH": "/bin"}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    for var in WAIT_VARS:
        assert wait_env({var: "1"}) == {}, var
    env = {"OMP_NUM_THREADS": "2"}
    assert passive_wait(env) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert env == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    assert passive_wait(env) == {} and env["OMP_WAIT_POLICY"] == "PASSIVE"


def _env(**extra: str) -> dict[str, str]:
    """This environment without any wait setting, with libgomp told to print what it read."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    env.update(extra)
    return env


def test_serve_runs_the_engine_with_no_spin(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "scalelab", "generate", "serve", "--model", "tiny"]
    with start_server(lambda port: [*cmd, "--port", str(port)], ready_path="/health",
                      timeout_s=60, log=log, env=_env()):
        pass
    text = log.read_text()
    # libgomp's default is 300000 rounds of spinning; PASSIVE makes it 0
    assert "GOMP_SPINCOUNT = '0'" in text, text[-2000:]


def test_the_users_setting_wins() -> None:
    cmd = [sys.executable, "-m", "scalelab", "generate", "complete", "abc", "--model", "tiny",
           "--max-tokens", "1"]
    out = subprocess.run(cmd, env=_env(OMP_WAIT_POLICY="ACTIVE"), capture_output=True, text=True,
                         timeout=120, check=True)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in out.stderr, out.stderr[-2000:]
