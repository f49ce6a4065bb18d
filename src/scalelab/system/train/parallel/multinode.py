"""A two-node run rehearsed on one machine: two torchrun agents as two "nodes" on 127.0.0.1,
one killed mid-run and replaced, the job resuming from its last checkpoint.

What happens, in the order a real cluster would see it:
1. Node A's agent starts and hosts the c10d rendezvous store (`is_host=1`); node B's agent
   joins it (`is_host=0`). Both run `--nnodes 2 --nproc-per-node P`: world = 2P.
2. Once a checkpoint is complete, node B is SIGKILLed whole (agent and workers: what losing a
   machine looks like). Node A's workers see their gloo peers vanish and fail; A's agent
   restarts them (`--max-restarts`) and waits in a new rendezvous round for a second node.
3. A replacement node B' (the same command, as a scheduler would relaunch it) joins; the new
   group loads the newest complete checkpoint and trains to the end.
4. The same job runs uninterrupted (one node, 2P processes: the same world and the same
   rank → data mapping); the final weights are compared bitwise.

On a real cluster the same command runs once per machine with `--rdzv-endpoint` pointing at
one of them (the first node hosts the store), or under a Kubernetes Job / PyTorchJob that sets
those flags per pod (see `scalelab deploy` and docs/parallel.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.web.spawn import free_port
from scalelab.system.train.launch import LaunchConfig, worker_env
from scalelab.system.train.parallel import ckpt
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.job import ParallelResult, prepare, run_parallel, summarize
from scalelab.system.train.rundir import final_weights, read_rank_reports, weights_diff


def agent_command(*, endpoint: str, rdzv_id: str, nproc: int, host: bool, max_restarts: int,
                  run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host={1 if host else 0},join_timeout=120",
            "--local-addr", "127.0.0.1", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.1", "-m", "scalelab.system.train.parallel.worker",
            str(run_dir)]


@dataclass(frozen=True, kw_only=True)
class NodeLoss:
    """The two-node run that lost a node, against the uninterrupted run."""

    killed_after_checkpoint: int
    """The newest complete checkpoint when node B was killed."""
    resumed_from_step: int | None
    recovery_s: float | None
    """From the kill to the re-formed group's first finished step (the replacement's start-up,
    the rendezvous round and the checkpoint load are most of it)."""
    bitwise_equal: bool
    max_abs_diff: float
    result: ParallelResult
    reference: ParallelResult


def _wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RunFailedError(f"node A's rendezvous store never listened on 127.0.0.1:{port}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass(frozen=True, kw_only=True)
class LostNode:
    """The two-node run that lost a node and finished on its replacement (no reference yet)."""

    cfg: ParallelConfig
    """The job as it ran (resume on, checkpoints in the run directory)."""
    result: ParallelResult
    killed_after_checkpoint: int
    resumed_from_step: int | None
    recovery_s: float | None


def lose_a_node(cfg: ParallelConfig, run_dir: Path, *, nproc: int = 1,
                timeout_s: float = 600.0) -> LostNode:
    """Run `cfg` on two local "nodes", kill one after the first checkpoint, replace it."""
    if cfg.checkpoint.every < 1 or cfg.steps < cfg.checkpoint.every + 2:
        raise RunFailedError("the node-loss rehearsal needs --checkpoint-interval N with "
                             "--steps >= N + 2 (a checkpoint before the kill, steps after it)")
    cfg = cfg.replace(checkpoint_dir=None, fail_at_step=None, resume=True)
    lc = LaunchConfig(nproc=nproc, nnodes="2", timeout_s=timeout_s)
    prep = prepare(cfg, lc, run_dir)
    root = run_dir / "checkpoints"
    port = free_port()
    endpoint, rdzv_id = f"127.0.0.1:{port}", f"scalelab-nodes-{os.getpid()}-{int(time.time())}"
    env = worker_env(prep.threads, restarts=True)
    deadline = time.monotonic() + timeout_s
    logs = [run_dir / f"node-{n}.log" for n in ("a", "b", "b2")]

    def start(host: bool, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                agent_command(endpoint=endpoint, rdzv_id=rdzv_id, nproc=nproc, host=host,
                              max_restarts=3, run_dir=run_dir),
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.perf_counter()
        procs.append(start(True, logs[0]))
        _wait_port(port, deadline)
        procs.append(start(False, logs[1]))
        run_key = cfg.run_key(2 * nproc)
        while not ckpt.complete_steps(root, run_key):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RunFailedError(f"no checkpoint before the kill; see {logs[0]}, {logs[1]}")
            time.sleep(0.05)
        killed_after = ckpt.complete_steps(root, run_key)[-1]
        kill_time = time.time()
        _kill(procs[1])
        procs.append(start(False, logs[2]))
        for p, log in ((procs[0], logs[0]), (procs[2], logs[2])):
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                raise RunFailedError(f"a node exited with status {rc} after the kill; see {log}")
        wall = time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        raise RunFailedError(f"the node-loss rehearsal ran past {timeout_s:g}s; its processes "
                             f"were killed (logs: {run_dir})") from None
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
    reports = read_rank_reports(run_dir, 2 * nproc)
    result = summarize(cfg, reports, run_dir, wall, prep.warning, prep.threads)
    first = reports[0].get("first_step_unix")
    return LostNode(cfg=cfg, result=result, killed_after_checkpoint=killed_after,
                    resumed_from_step=(result.resumed_from or {}).get("step"),
                    recovery_s=(first - kill_time) if first else None)


def against(lost: LostNode, reference: ParallelResult) -> NodeLoss:
    """`lost` against an uninterrupted run of the same job on one node (same world, so the
    same rank → data mapping): bitwise equal final weights is the promise."""
    equal, diff = weights_diff(final_weights(Path(lost.result.run_dir)),
                               final_weights(Path(reference.run_dir)))
    return NodeLoss(killed_after_checkpoint=lost.killed_after_checkpoint,
                    resumed_from_step=lost.resumed_from_step, recovery_s=lost.recovery_s,
                    bitwise_equal=equal, max_abs_diff=diff, result=lost.result,
                    reference=reference)


def rehearse_node_loss(cfg: ParallelConfig, run_dir: Path, *, nproc: int = 1,
                       timeout_s: float = 600.0) -> NodeLoss:
    """Run `cfg` on two local "nodes", kill one after the first checkpoint, replace it, and
    compare with the same job run uninterrupted on one node (in run_dir/reference)."""
    lost = lose_a_node(cfg, run_dir, nproc=nproc, timeout_s=timeout_s)
    reference = run_parallel(lost.cfg.replace(checkpoint_every=0),
                             LaunchConfig(nproc=2 * nproc, timeout_s=timeout_s),
                             run_dir / "reference")
    return against(lost, reference)
