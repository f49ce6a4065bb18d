"""Scale the user's own command: run it once per level and repeat, measure the process tree.

Each run records wall time, CPU time (user + system of the waited-for process tree, from
RUSAGE_CHILDREN deltas — orphaned daemons the command leaves behind are not counted), peak RSS of
the whole tree (sampled every `poll_s`; a spike shorter than that can be missed), exit status, and
an optional metric parsed from stdout. A failing level is a recorded failure, never a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import psutil

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.fits import ScalingFit, fit_scaling
from scalelab.lab.core.knee import find_knee
from scalelab.lab.core.machine import Machine, current_machine
from scalelab.lab.core.peak_memory import tree_rss
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.core.signals import Resources
from scalelab.lab.core.usage import iowait_share, iowait_ticks

Mode = Literal["strong", "weak"]


@dataclass(kw_only=True)
class SweepConfig:
    """One variable, its levels, and the command that runs at each level."""

    variable: str
    """Name of the scaled variable; `{name}` in the command is replaced by the level."""
    levels: list[float]
    command: list[str]
    repeats: int = 1
    """Runs per level; medians and ranges are reported across them."""
    timeout_s: float = 600.0
    """A run still going after this is killed (its whole process group) and recorded as failed."""
    metric: str | None = None
    """'json:KEY' (dotted key of the last JSON object printed) or a regex with one group."""
    mode: Mode = "strong"
    """strong: fixed work, throughput = 1/wall; weak: work grows with the level, = level/wall.
    With a metric, the metric itself is the throughput (it should be a rate)."""
    poll_s: float = 0.02
    """RSS sampling interval for the process tree."""
    experiment: str = "sweep"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.variable):
            raise BadUsageError(f"--var name {self.variable!r} must be an identifier, e.g. workers")
        if not self.levels:
            raise BadUsageError("--var needs at least one level, e.g. workers=1,2,5,10")
        if not self.command:
            raise BadUsageError("no command given; put it after '--', e.g. -- ./job --n {workers}")
        if self.repeats < 1:
            raise BadUsageError(f"--repeats must be >= 1 (got {self.repeats})")
        if not self.timeout_s > 0:
            raise BadUsageError("--timeout must be positive")
        if self.metric is not None and not self.metric.startswith("json:"):
            try:
                rx = re.compile(self.metric)
            except re.error as e:
                raise BadUsageError(f"--metric {self.metric!r} is not a valid regex ({e})") from e
            if rx.groups != 1:
                raise BadUsageError(
                    "--metric regex must have exactly one capture group, "
                    r"e.g. 'throughput: ([0-9.]+)'"
                )


@dataclass(frozen=True, kw_only=True)
class RunResult:
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    exit_code: int | None
    timed_out: bool
    metric: float | None
    stdout_tail: str
    stderr_tail: str
    iowait_share: float | None = None
    """The machine's I/O-wait share of CPU time while the run ran (/proc/stat; None: not there)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(kw_only=True)
class SweepResult:
    config: SweepConfig
    records: list[Record] = field(default_factory=list)
    fit: ScalingFit | None = None
    knee: float | None = None
    fit_error: str | None = None


def level_text(level: float) -> str:
    return str(int(level)) if float(level).is_integer() else repr(float(level))


def substitute(command: list[str], variable: str, level: float) -> list[str]:
    return [a.replace("{" + variable + "}", level_text(level)) for a in command]


def _dig(obj: object, key: str) -> float | None:
    for part in key.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    if isinstance(obj, int | float) and not isinstance(obj, bool):
        return float(obj)
    return None


def parse_metric(spec: str, stdout: str) -> float | None:
    """Extract the metric from a run's stdout; None when it is absent or not a number.

    `json:KEY` reads a dotted key of the whole output when it is one JSON document (as
    `scalelab ... --json` prints), else of the last line that is a JSON object.
    """
    if spec.startswith("json:"):
        key = spec[5:]
        with contextlib.suppress(json.JSONDecodeError):
            return _dig(json.loads(stdout), key)
        for line in reversed(stdout.strip().splitlines()):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                return _dig(json.loads(line), key)
            except json.JSONDecodeError:
                continue
        return None
    matches = re.findall(spec, stdout)
    if not matches:
        return None
    try:
        return float(matches[-1])
    except ValueError:
        return None


def _tail(path: str, limit: int = 4000) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", errors="replace")


def run_once(
    command: list[str],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    metric: str | None = None,
    poll_s: float = 0.02,
) -> RunResult:
    """Run one command to completion (or timeout) and measure its process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    io_before = iowait_ticks()
    with (
        tempfile.NamedTemporaryFile(prefix="sweep-out-", delete=False) as out,
        tempfile.NamedTemporaryFile(prefix="sweep-err-", delete=False) as err,
    ):
        out_path, err_path = out.name, err.name
    peak = 0
    stop = threading.Event()
    try:
        with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
            t0 = time.perf_counter()
            try:
                proc = subprocess.Popen(
                    command,
                    stdout=fo,
                    stderr=fe,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            except (FileNotFoundError, PermissionError) as e:
                return RunResult(
                    wall_s=0.0,
                    cpu_s=0.0,
                    peak_rss_bytes=0,
                    exit_code=127,
                    timed_out=False,
                    metric=None,
                    stdout_tail="",
                    stderr_tail=f"cannot start {command[0]!r}: {e}",
                )

            def sample() -> None:
                nonlocal peak
                try:
                    ps = psutil.Process(proc.pid)
                except psutil.Error:
                    return
                while not stop.is_set():
                    peak = max(peak, tree_rss(ps))
                    stop.wait(poll_s)

            sampler = threading.Thread(target=sample, daemon=True)
            timed_out = False
            try:
                # Inside the try: an interrupt while the sampler starts (slow on a loaded
                # machine) must stop the command too.
                sampler.start()
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            except BaseException:
                # Interrupted (Ctrl-C, or a diagnose stopping its step): the command runs in a
                # session of its own, so nothing else would stop it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                stop.set()
                raise
            wall = time.perf_counter() - t0
            stop.set()
            sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        io_share = iowait_share(io_before, iowait_ticks())
        stdout = _tail(out_path, 1 << 20)
        value = parse_metric(metric, stdout) if metric and code == 0 else None
        return RunResult(
            wall_s=wall,
            cpu_s=cpu,
            peak_rss_bytes=peak,
            exit_code=code,
            timed_out=timed_out,
            metric=value,
            stdout_tail=stdout[-4000:],
            stderr_tail=_tail(err_path),
            iowait_share=io_share,
        )
    finally:
        for p in (out_path, err_path):
            with contextlib.suppress(OSError):
                os.unlink(p)


def limiting_resource(cpu_s: float, wall_s: float, peak_rss: int, m: Machine) -> str:
    """Name what held the run back, from measured CPU busy time and memory, with the numbers.

    'cpu' when the tree kept >= 85% of the cores busy; 'memory' past 85% of RAM; otherwise
    'not cpu': the run waited (I/O, network, locks, sleeps or a serial phase on one core).
    """
    if wall_s <= 0:
        return "unknown"
    busy = cpu_s / wall_s
    if peak_rss > 0.85 * m.memory_bytes:
        return f"memory {peak_rss / m.memory_bytes:.0%} of RAM"
    if busy >= 0.85 * m.cores:
        return f"cpu {busy:.2f}/{m.cores} cores"
    return f"not cpu {busy:.2f}/{m.cores} cores"


def throughput(cfg: SweepConfig, level: float, r: RunResult) -> float | None:
    if not r.ok or r.wall_s <= 0:
        return None
    if cfg.metric is not None:
        return r.metric
    return (level if cfg.mode == "weak" else 1.0) / r.wall_s


ProgressFn = Callable[[float, int, RunResult], None]


Executor = Callable[[list[str], dict[str, str], "SweepConfig"], tuple["RunResult", Machine, str]]
"""Runs one command with these extra environment variables somewhere; returns its result, the
machine it ran on and that host's name (`run_here` locally; the CLI's --cluster on a worker)."""


def run_here(cmd: list[str], extra_env: dict[str, str],
             cfg: SweepConfig) -> tuple[RunResult, Machine, str]:
    """Run on this machine: the default executor, and what a Dask worker calls for --cluster
    (the worker's own environment, plus the level's variable)."""
    env = {**os.environ, **extra_env}
    r = run_once(cmd, timeout_s=cfg.timeout_s, env=env, metric=cfg.metric, poll_s=cfg.poll_s)
    return r, current_machine(), socket.gethostname()


def run_sweep(cfg: SweepConfig, *, on_run: ProgressFn | None = None,
              execute: Executor = run_here) -> SweepResult:
    """Run every level × repeat, build records, then fit the curve over the successful runs.
    Each record's machine (and extras' host) is where `execute` ran the command."""
    result = SweepResult(config=cfg)
    for level in cfg.levels:
        cmd = substitute(cfg.command, cfg.variable, level)
        extra_env = {f"SCALELAB_{cfg.variable.upper()}": level_text(level)}
        for rep in range(cfg.repeats):
            r, m, host = execute(cmd, extra_env, cfg)
            x = throughput(cfg, level, r)
            error = None
            if r.timed_out:
                error = f"timed out after {cfg.timeout_s:g} s"
            elif r.exit_code != 0:
                last = r.stderr_tail.strip().splitlines()[-1:] or [""]
                error = f"exit status {r.exit_code}: {last[0][:200]}"
            elif cfg.metric is not None and r.metric is None:
                error = f"metric {cfg.metric!r} not found in the output"
            result.records.append(
                make_record(
                    experiment=cfg.experiment,
                    stage="sweep",
                    variable=cfg.variable,
                    level=level,
                    repeat=rep,
                    machine=m,
                    wall_s=r.wall_s,
                    rate=x,
                    rate_unit="metric"
                    if cfg.metric
                    else ("runs/s" if cfg.mode == "strong" else f"{cfg.variable}·runs/s"),
                    peak_memory_bytes=r.peak_rss_bytes,
                    failures=0 if error is None else 1,
                    failure_rate=0.0 if error is None else 1.0,
                    ok=error is None,
                    error=error,
                    limiting_resource=limiting_resource(r.cpu_s, r.wall_s, r.peak_rss_bytes, m)
                    if r.ok
                    else None,
                    extras={
                        "cpu_s": r.cpu_s,
                        "exit_code": r.exit_code,
                        "metric": r.metric,
                        "command": cmd,
                        "host": host,
                    },
                    resources=Resources(
                        cpu_busy_cores=r.cpu_s / r.wall_s if r.wall_s else None,
                        iowait_share=r.iowait_share,
                    ),
                )
            )
            if on_run is not None:
                on_run(level, rep, r)
    ok = [(rec.level, rec.rate) for rec in result.records if rec.ok and rec.rate is not None]
    levels = sorted({lv for lv, _ in ok})
    if len(levels) >= 2:
        try:
            result.fit = fit_scaling(
                [lv for lv, _ in ok], [float(x) for _, x in ok if x is not None]
            )
            result.knee = find_knee(result.fit.levels, result.fit.throughput)
        except Exception as e:  # a degenerate curve must not lose the measurements
            result.fit_error = str(e)
    else:
        result.fit_error = f"{len(levels)} level(s) succeeded; a fit needs at least 2"
    return result


def level_summary(result: SweepResult) -> list[dict[str, float | int | str | None]]:
    """Medians and ranges per level, for the sheet."""
    rows: list[dict[str, float | int | str | None]] = []
    for level in result.config.levels:
        recs = [r for r in result.records if r.level == level]
        ok = [r for r in recs if r.ok]
        walls = sorted(r.wall_s for r in ok if r.wall_s is not None)
        rates = sorted(r.rate for r in ok if r.rate is not None)
        rss = [r.peak_memory_bytes for r in ok if r.peak_memory_bytes is not None]
        cpu = sorted(float(r.extras["cpu_s"]) for r in ok)

        def med(v: list[float]) -> float | None:
            if not v:
                return None
            k = len(v)
            return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2

        rows.append(
            {
                "level": level,
                "runs": len(recs),
                "failures": len(recs) - len(ok),
                "wall_s_median": med(walls),
                "wall_s_min": walls[0] if walls else None,
                "wall_s_max": walls[-1] if walls else None,
                "throughput_median": med(rates),
                "cpu_s_median": med(cpu),
                "peak_rss_bytes_max": max(rss) if rss else None,
                "limiting_resource": ok[0].limiting_resource
                if ok
                else (recs[0].error if recs else None),
            }
        )
    if result.fit is not None:
        eff = dict(zip(result.fit.levels, result.fit.efficiency, strict=True))
        kf = dict(zip(result.fit.levels, result.fit.karp_flatt, strict=True))
        for row in rows:
            lv = float(row["level"] or 0)
            row["efficiency"] = eff.get(lv)
            row["karp_flatt"] = kf.get(lv)
    return rows
