"""Starting a training run under torchrun, bounded in time: the launch both trainers use.

A trainer's job writes the run directory (train.rundir), then runs
`python -m torch.distributed.run ... -m WORKER RUN_DIR` in its own process group;
on timeout the whole group (agent and workers) is killed. Single-node runs use a c10d rendezvous
on 127.0.0.1 at a free port. Restarts (--max-restarts) set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1:
with torch 2.13 + gloo, restarted groups that reuse the agent's rendezvous TCP store were seen to
fail or hang; a fresh store per round made them reliable (verified by the recovery tests).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.lab.core.machine import available_cores
from scalelab.layers.web.spawn import free_port
from scalelab.system.train.rundir import LOG_FILE, clear_results, read_progress

POLL_S = 0.5
"""How often a waiting launcher reads rank 0's progress."""


@dataclass(kw_only=True)
class LaunchConfig:
    """How torchrun starts the workers."""

    nproc: int = 1
    """Worker processes on this node."""
    nnodes: str = "1"
    """Node count or elastic range MIN:MAX."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous; None runs a local one on 127.0.0.1 at a free port."""
    rdzv_id: str | None = None
    """Job id shared by all nodes of one run; None makes one up."""
    max_restarts: int = 0
    """Times torchrun restarts the worker group after a worker fails."""
    timeout_s: float = 600.0
    """Wall-clock bound of the whole run; on expiry the process group is killed."""
    run_dir: str | None = None
    """Where the run's files go; None uses a temporary folder removed afterwards."""
    cuda: bool = False
    """Train on CUDA with nccl (needs a GPU); gloo on CPU otherwise."""

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise BadUsageError(f"--nproc must be >= 1; got {self.nproc}")
        if self.max_restarts < 0:
            raise BadUsageError(f"--max-restarts must be >= 0; got {self.max_restarts}")
        if not self.timeout_s > 0:
            raise BadUsageError(f"--timeout must be > 0; got {self.timeout_s}")
        parts = self.nnodes.split(":")
        if not (1 <= len(parts) <= 2 and all(p.isdigit() and int(p) >= 1 for p in parts)):
            raise BadUsageError(
                f"--nnodes must be N or MIN:MAX (e.g. 1 or 1:2); got {self.nnodes!r}")
        if len(parts) == 2 and int(parts[0]) > int(parts[1]):
            raise BadUsageError(f"--nnodes {self.nnodes}: MIN is larger than MAX")
        if self.rdzv_endpoint is not None and ":" not in self.rdzv_endpoint:
            raise BadUsageError(f"--rdzv-endpoint must be HOST:PORT; got {self.rdzv_endpoint!r}")
        if self.cuda and not torch.cuda.is_available():
            raise BadUsageError(
                "--device cuda needs a CUDA GPU; none is visible (use --device cpu)")

    def min_nodes(self) -> int:
        return int(self.nnodes.split(":")[0])


def plan_threads(nproc: int, threads: int | None, cores: int) -> tuple[int, str | None]:
    """Threads per process (cores // processes by default) and a warning when oversubscribed."""
    t = threads or max(1, cores // nproc)
    warn = None
    if nproc * t > cores:
        warn = (f"{nproc} processes x {t} threads = {nproc * t} > {cores} cores: "
                "oversubscribed; expect each step to run 2-7x slower than the cores allow")
    return t, warn


def torchrun_command(lc: LaunchConfig, run_dir: Path, *,
                     worker: str = "scalelab.system.train.worker",
                     tag: str = "scalelab") -> list[str]:
    """torchrun running `python -m WORKER RUN_DIR` per process (the flights trainer's worker by
    default; the transformer trainer's with its own rendezvous-id `tag`)."""
    # The rendezvous port: one free-port routine for the project (web.spawn's).
    endpoint = lc.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nnodes", lc.nnodes, "--nproc-per-node", str(lc.nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
           "--rdzv-id", lc.rdzv_id or f"{tag}-{os.getpid()}-{int(time.time())}",
           "--max-restarts", str(lc.max_restarts), "--monitor-interval", "0.1"]
    if lc.rdzv_endpoint is None:
        cmd += ["--local-addr", "127.0.0.1"]
    return [*cmd, "-m", worker, str(run_dir)]


def worker_env(threads: int, restarts: bool) -> dict[str, str]:
    """The workers' environment: `threads` intra-op threads, unbuffered logs, deterministic
    cuBLAS; with restarts, a fresh TCP store per restarted group."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if restarts:
        # See the module doc: restarted gloo groups reusing the agent's store were unreliable.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def _wait(proc: subprocess.Popen[bytes], timeout_s: float,
          on_poll: Callable[[], None] | None) -> int:
    """proc's exit status; `on_poll` every POLL_S while it runs. TimeoutExpired past timeout_s."""
    if on_poll is None:
        return proc.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, left)))
        except subprocess.TimeoutExpired:
            if left <= POLL_S:
                raise
            on_poll()


def run_group(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float, *,
              train_less: str, on_poll: Callable[[], None] | None = None) -> float:
    """Run torchrun in its own process group to completion, logging to `log`; the wall
    seconds. On timeout or interruption the whole group is killed. Raises RunFailedError
    naming the last worker error; `train_less` names the flags that shorten a run; `on_poll`
    is called every POLL_S while it runs (live progress)."""
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = _wait(proc, timeout_s, on_poll)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RunFailedError(
                f"training did not finish within --timeout {timeout_s:g}s; all its processes "
                f"were killed. Raise --timeout or train less ({train_less}). "
                f"Log: {log}") from None
        except BaseException:
            _kill_group(proc)
            raise
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RunFailedError(f"training failed (torchrun exit status {rc}): {_tail(log)} "
                             f"(full log: {log})")
    return wall


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


_WORKER_ERROR = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception|Interrupt): .*")


def _tail(path: Path, lines: int = 8) -> str:
    """The last worker exception in the log if there is one, else its last lines."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    errors = [ln for ln in text if _WORKER_ERROR.match(ln) and "ChildFailedError" not in ln]
    # The last one: after a restart, the first errors are the expected fallout of the kill.
    found = errors[-1] if errors else " | ".join(text[-lines:])
    # Brackets in gloo's messages ([/path/pair.cc:553]) read as console markup downstream.
    return found.replace("[", "(").replace("]", ")")


@dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """A run directory made ready for torchrun (each trainer's job adds what it wrote there)."""

    run_dir: Path
    threads: int
    """Intra-op threads per worker process."""
    warning: str | None
    """Why the thread plan oversubscribes the cores, if it does."""


def ready_run_dir(lc: LaunchConfig, run_dir: Path, threads: int | None) -> tuple[int, str | None]:
    """Create `run_dir` without an earlier run's results; (threads per worker, warning)."""
    planned, warning = plan_threads(lc.nproc, threads, available_cores())
    run_dir.mkdir(parents=True, exist_ok=True)
    clear_results(run_dir)
    return planned, warning


def run_torchrun(lc: LaunchConfig, run_dir: Path, *, threads: int, worker: str, tag: str,
                 restarts: bool, train_less: str,
                 on_progress: Callable[[int, int, float], None] | None = None) -> float:
    """Run `worker`'s processes on the prepared `run_dir` to completion; the wall seconds.
    Raises RunFailedError. `restarts`: torchrun may restart the group (a fresh rendezvous store
    per round); `on_progress(step, total, loss)` with rank 0's latest step while they run."""

    def poll() -> None:
        doc = read_progress(run_dir)
        if doc is not None and on_progress is not None:
            on_progress(int(doc["step"]), int(doc["total"]), float(doc["loss"]))

    return run_group(torchrun_command(lc, run_dir, worker=worker, tag=tag),
                     worker_env(threads, restarts or lc.max_restarts > 0),
                     run_dir / LOG_FILE, lc.timeout_s, train_less=train_less,
                     on_poll=poll if on_progress is not None else None)


@contextlib.contextmanager
def run_directory(path: str | None) -> Any:
    """The given folder, or a temporary one removed when the run succeeded."""
    if path is not None:
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        yield p
        return
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-train-"))
    yield tmp
    # Only on success: after a failure the folder (and the log the error names) stays for
    # diagnosis.
    shutil.rmtree(tmp, ignore_errors=True)
