"""Harness for the training crash-consistency trials (tests/reliability/test_train_crash.py).

Launches the real trainer (`python -m torch.distributed.run ... -m scalelab.system.train.worker`) on
a prepared run directory, kills it — from inside through the checkpoint test hook
(SCALELAB_TEST_KILL_AT / SCALELAB_TEST_KILL_ONCE, see scalelab.system.train.checkpoint.crash_point)
or from outside with SIGKILL to the whole process group — and checks the checkpoint folder with a
verifier of its own (not CheckpointStore's), so a bug in the store cannot vouch for itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from scalelab.system.train.checkpoint import CRASH_POINTS, KILL_AT_ENV, KILL_ONCE_ENV, MARKER
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.job import prepare_run
from scalelab.system.train.launch import LaunchConfig, torchrun_command
from scalelab.system.train.rundir import CONFIG_FILE, FINAL_FILE, rank_file

STEPS = 12
EVERY = 2
KEEP = 2
LAUNCH_TIMEOUT_S = 240.0
RUN_FILES = ("config.json", "meta.json", "data.safetensors", "preprocess.json")
JOB = "job"
"""Kill kind: SIGKILL the whole process group (agent and workers) from outside."""


def base_config(**kw: Any) -> TabularRunConfig:
    return TabularRunConfig(limit=4000, batch=128, base_batch=128, max_steps=STEPS, hidden=[16],
                            seed=11, checkpoint_every=EVERY, keep=KEEP, flop_count=False, **kw)


def prepare_template(root: Path, world: int) -> Path:
    """Encode the data once per world size; trials copy the folder."""
    d = root / f"template-{world}"
    prepare_run(base_config(), LaunchConfig(nproc=world), d)
    return d


def trial_dir(template: Path, dest: Path, **overrides: Any) -> Path:
    dest.mkdir(parents=True)
    for name in RUN_FILES:
        shutil.copy2(template / name, dest / name)
    if overrides:
        cfg = json.loads((dest / CONFIG_FILE).read_text(encoding="utf-8"))
        cfg.update(overrides)
        (dest / CONFIG_FILE).write_text(json.dumps(cfg), encoding="utf-8")
    return dest


def ckpt_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


@dataclass(frozen=True, kw_only=True)
class Kill:
    point: str
    """One of CRASH_POINTS, or JOB."""
    step: int
    """Steps done at the kill (the checkpoint's step for ckpt-* points); for JOB, the kill is
    sent once a checkpoint of this step or later is committed."""
    rank: int = 0

    def expected_resume(self, asynchronous: bool) -> int | None:
        """The newest checkpoint complete at the kill, when the kill point fixes it."""
        if self.point == JOB or asynchronous:
            return None  # timing decides; the disk verifier says which
        if self.point == "step":
            s = self.step - self.step % EVERY
        elif self.point == "ckpt-renamed":
            s = self.step
        else:  # torn, written or marked: this step's checkpoint is not complete
            s = self.step - EVERY
        return s if s >= EVERY else None


@dataclass(frozen=True, kw_only=True)
class Trial:
    seed: int
    world: int
    mode: str
    """rerun: the job dies and the same command is run again; restart: torchrun --max-restarts."""
    kills: list[Kill]
    asynchronous: bool = False
    corrupt_newest: bool = False
    """rerun only: after the kill, truncate the newest complete checkpoint's state.pt."""

    def label(self) -> str:
        ks = "+".join(f"{k.point}@{k.step}r{k.rank}" for k in self.kills)
        extra = ("-async" if self.asynchronous else "") + ("-corrupt" if self.corrupt_newest
                                                            else "")
        return f"s{self.seed}-w{self.world}-{self.mode}-{ks}{extra}"


def random_trial(seed: int, world: int, point: str) -> Trial:
    """A seeded trial: `point` for the first kill, the rest drawn from `seed`."""
    rng = random.Random(seed)
    ckpt_steps = list(range(EVERY, STEPS, EVERY))
    if point == JOB:
        return Trial(seed=seed, world=world, mode="rerun",
                     kills=[Kill(point=JOB, step=rng.choice(ckpt_steps))])
    mode = rng.choice(["rerun", "restart"])
    kills: list[Kill] = []
    last = -1
    # The hook holds one kill point per launch: torchrun restarts get one kill, re-runs up to 3.
    for i in range(1 if mode == "restart" else rng.choice([1, 1, 2, 3])):
        p = point if i == 0 else rng.choice(CRASH_POINTS)
        options = ([s for s in range(STEPS) if s > last] if p == "step"
                   else [s for s in ckpt_steps if s > last])
        if not options:
            break
        step = rng.choice(options)
        rank = rng.randrange(world) if p in ("step", "ckpt-torn", "ckpt-written") else 0
        kills.append(Kill(point=p, step=step, rank=rank))
        last = step
    asynchronous = mode == "rerun" and rng.random() < 0.25
    corrupt = mode == "rerun" and not asynchronous and rng.random() < 0.3
    return Trial(seed=seed, world=world, mode=mode, kills=kills, asynchronous=asynchronous,
                 corrupt_newest=corrupt)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def complete_steps(root: Path, world: int) -> list[int]:
    """Steps of the checkpoints whose marker lists state.pt and every rank's file, all intact."""
    out = []
    for d in sorted(root.glob("step-*")):
        try:
            files = json.loads((d / MARKER).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError):
            continue
        needed = {"state.pt", *(f"rank-{r}.pt" for r in range(world))}
        if needed <= files.keys() and all(
                (d / n).is_file() and sha256(d / n) == h for n, h in files.items()):
            out.append(int(d.name.split("-")[1]))
    return out


def tmp_entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".")) if root.is_dir() \
        else []


def final_entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("step-*")) if root.is_dir() else []


@dataclass(kw_only=True)
class Launch:
    rc: int
    wall_s: float
    killed_from_outside: bool = False
    at_kill: list[str] = field(default_factory=list)
    """Checkpoint-folder entries seen when the outside kill was sent."""


def launch(run_dir: Path, world: int, *, max_restarts: int = 0, env: dict[str, str] | None = None,
           kill: Kill | None = None) -> Launch:
    """One torchrun launch; with a JOB kill, SIGKILL its process group once enough checkpoints
    are committed (polled, bounded by the launch timeout)."""
    for stale in [*run_dir.glob("rank-*.json"), run_dir / FINAL_FILE]:
        stale.unlink(missing_ok=True)
    e = dict(os.environ)
    e.pop(KILL_AT_ENV, None)
    e.pop(KILL_ONCE_ENV, None)
    e.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
              "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})})
    cmd = torchrun_command(LaunchConfig(nproc=world, max_restarts=max_restarts), run_dir)
    t0 = time.perf_counter()
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    out = Launch(rc=0, wall_s=0.0)
    with (run_dir / f"torchrun-{time.time_ns()}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e,
                                start_new_session=True)
        try:
            if kill is not None and kill.point == JOB:
                root = ckpt_root(run_dir)
                while proc.poll() is None and time.monotonic() < deadline:
                    done = [int(n.split("-")[1]) for n in final_entries(root)]
                    if (done and max(done) >= kill.step) or (run_dir / FINAL_FILE).exists():
                        out.at_kill = final_entries(root) + tmp_entries(root)
                        os.killpg(proc.pid, signal.SIGKILL)
                        out.killed_from_outside = True
                        break
                    time.sleep(0.002)
            out.rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if out.killed_from_outside:
        # The workers are in the group too, but reap any straggler before the next launch.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out.wall_s = time.perf_counter() - t0
    return out


def kill_env(kill: Kill, flag: Path) -> dict[str, str]:
    return {KILL_AT_ENV: f"{kill.point}:{kill.step}:{kill.rank}", KILL_ONCE_ENV: str(flag)}


def reports(run_dir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads(rank_file(run_dir, r).read_text(encoding="utf-8")) for r in range(world)]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / FINAL_FILE))


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def log_tail(run_dir: Path, lines: int = 30) -> str:
    logs = sorted(run_dir.glob("torchrun-*.log"))
    if not logs:
        return ""
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])


def live_processes(run_dir: Path) -> list[int]:
    """Pids whose command line names `run_dir` (torchrun agents and workers of this trial)."""
    needle = str(run_dir).encode()
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
    return pids


def wait_all_gone(run_dir: Path, timeout_s: float = 15.0) -> list[int]:
    """Poll until no process of the trial is left (bounded); the survivors, if any."""
    deadline = time.monotonic() + timeout_s
    while (left := live_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
