from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.job import run_training
from scalelab.system.train.launch import LaunchConfig, plan_threads, torchrun_command

from .conftest import LIMIT


def test_threads_default_to_cores_over_processes() -> None:
    assert plan_threads(1, None, 2) == (2, None)
    assert plan_threads(2, None, 2) == (1, None)
    t, warn = plan_threads(4, None, 2)
    assert t == 1 and warn is not None and "4 processes x 1 threads = 4 > 2 cores" in warn
    t, warn = plan_threads(2, 2, 2)
    assert t == 2 and warn is not None and "oversubscribed" in warn


@pytest.mark.parametrize("kw, match", [
    ({"nproc": 0}, "--nproc"),
    ({"nnodes": "2:1"}, "MIN is larger"),
    ({"nnodes": "x"}, "--nnodes"),
    ({"rdzv_endpoint": "nohost"}, "HOST:PORT"),
    ({"max_restarts": -1}, "--max-restarts"),
    ({"timeout_s": 0}, "--timeout"),
])
def test_bad_launch_settings(kw: dict[str, object], match: str) -> None:
    with pytest.raises(BadUsageError, match=match):
        LaunchConfig(**kw)  # type: ignore[arg-type]


def test_torchrun_command_uses_local_rendezvous(tmp_path: Path) -> None:
    cmd = torchrun_command(LaunchConfig(nproc=2, max_restarts=1), tmp_path)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    endpoint = cmd[cmd.index("--rdzv-endpoint") + 1]
    assert endpoint.startswith("127.0.0.1:")
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--max-restarts") + 1] == "1"
    assert cmd[-3:] == ["-m", "scalelab.system.train.worker", str(tmp_path)]
    multi = torchrun_command(LaunchConfig(nnodes="1:2", rdzv_endpoint="h:29500"), tmp_path)
    assert "--local-addr" not in multi and multi[multi.index("--nnodes") + 1] == "1:2"


def test_timeout_kills_every_process_of_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = TabularRunConfig(limit=LIMIT, batch=64, epochs=50)
    with pytest.raises(RunFailedError, match="did not finish within --timeout 2s"):
        run_training(cfg, LaunchConfig(nproc=2, timeout_s=2, run_dir=str(run_dir)))
    left = [p for p in psutil.process_iter(["cmdline"])
            if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_run_group_polls_while_it_waits_and_still_times_out(tmp_path: Path) -> None:
    import sys

    from scalelab.system.train.launch import POLL_S, run_group

    polls: list[int] = []
    sleep = [sys.executable, "-c", "import time; time.sleep(1.6)"]
    wall = run_group(sleep, {}, tmp_path / "a.log", 30, train_less="-",
                     on_poll=lambda: polls.append(1))
    assert wall >= 1.6 and len(polls) >= int(1.6 / POLL_S) - 1
    polls.clear()
    with pytest.raises(RunFailedError, match=r"did not finish within --timeout 1\.2s"):
        run_group([sys.executable, "-c", "import time; time.sleep(30)"], {},
                  tmp_path / "b.log", 1.2, train_less="-", on_poll=lambda: polls.append(1))
    assert 1 <= len(polls) <= int(1.2 / POLL_S)
