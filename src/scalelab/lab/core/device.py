"""A target device a user names (`cores=1,memory=512MiB`) and a child process held to it.

The model's edge case is a small box: one or two cores and a few hundred MiB. `DeviceProfile`
says what that box is; `run_limited` runs a command (a `scalelab` subprocess) pinned to that many
of this machine's CPUs (`sched_setaffinity`), with that many intra-op threads, under a memory
limit, and reports whether the work fit, its peak RSS and the CPUs it really ran on.

The memory limit, in order of preference:

- ``cgroup2``: a child cgroup with ``memory.max`` (and ``memory.swap.max`` 0) under this
  process's own cgroup v2, where that cgroup delegates the memory controller to its children
  (``memory`` in ``cgroup.subtree_control``) and is writable. It limits what the work really
  uses (RSS + page cache) and the kernel's OOM killer ends the work when it is over.
- ``rlimit_as``: ``RLIMIT_AS`` (address space), set by the child on itself at start. Always
  available, but it counts *virtual* memory: every thread's stack reservation, glibc's per-thread
  malloc arenas and the shared libraries' mappings count in full, resident or not. A torch process
  reserves far more address space than it touches (docs/model.md measures 2.4-3x its peak RSS),
  so under ``rlimit_as`` the limit is stricter than the same number on a real device.

"Fit" means the work ran to the end within the limit. "No fit" is an allocation the limit
refused (MemoryError, a failed mmap of a shared library, torch's allocator) or the cgroup's OOM
killer; anything else the child died of is an error, reported as such (`fit` is None).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.lab.core.device_child import CGROUP_ENV, CPUS_ENV, REPORT_ENV, RLIMIT_ENV
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import parse_size

KEYS = ("cores", "memory", "threads")
CHILD_MODULE = "scalelab.lab.core.device_child"

# What an allocation refused by the limit looks like in a Python/torch child's stderr.
NO_FIT_PATTERNS = (
    r"\bMemoryError\b", r"Cannot allocate memory", r"failed to map segment",
    r"std::bad_alloc", r"DefaultCPUAllocator: can't allocate memory",
    r"not enough memory", r"out of memory", r"OpenBLAS.*(?:memory|mmap)",
    r"pthread_create failed", r"can't start new thread", r"Resource temporarily unavailable",
)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), sorted."""
    return sorted(os.sched_getaffinity(0))


def compact_size(n: int) -> str:
    """512MiB, 1GiB, 1536KiB or 1000B: exact, and parseable back (pure)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """The target device, as `--device cores=N,memory=SIZE[,threads=T]` names it."""

    cores: int | None = None
    """CPUs the work may run on: the first N of this process's allowed CPUs (None: all)."""
    memory_bytes: int | None = None
    """Memory limit of the work's process (None: no limit)."""
    threads: int | None = None
    """Intra-op threads (torch, OpenMP, ONNX Runtime); None: one per core of `cores`."""

    def __post_init__(self) -> None:
        have = len(allowed_cpus())
        if self.cores is not None and not 1 <= self.cores <= have:
            raise BadUsageError(f"--device cores={self.cores}: this machine lets scalelab use "
                                f"{have} CPU(s); give cores=1..{have}")
        if self.threads is not None and self.threads < 1:
            raise BadUsageError(f"--device threads={self.threads}: give threads >= 1")
        if self.memory_bytes is not None and self.memory_bytes < 1 << 20:
            raise BadUsageError(f"--device memory={compact_size(self.memory_bytes)}: give at "
                                "least 1MiB")

    @classmethod
    def parse(cls, spec: str) -> DeviceProfile:
        """`cores=1,memory=512MiB,threads=1` (any subset, at least one key)."""
        values: dict[str, str] = {}
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not value:
                raise BadUsageError(f"--device {spec!r}: {part!r} is not key=value; "
                                    "e.g. --device cores=1,memory=512MiB")
            if key not in KEYS:
                raise BadUsageError(f"--device {spec!r}: unknown key {key!r}; use "
                                    f"{', '.join(KEYS)} (e.g. cores=1,memory=512MiB)")
            if key in values:
                raise BadUsageError(f"--device {spec!r}: {key} given twice")
            values[key] = value
        if not values:
            raise BadUsageError("--device '': give e.g. cores=1,memory=512MiB")
        ints: dict[str, int] = {}
        for key in ("cores", "threads"):
            if key in values:
                try:
                    ints[key] = int(values[key])
                except ValueError:
                    raise BadUsageError(f"--device {key}={values[key]!r}: give a whole number"
                                        ) from None
        mem = (parse_size(values["memory"], what="--device memory")
               if "memory" in values else None)
        return cls(cores=ints.get("cores"), memory_bytes=mem, threads=ints.get("threads"))

    @property
    def cpus(self) -> list[int]:
        """The CPUs the work is pinned to."""
        cpus = allowed_cpus()
        return cpus[: self.cores] if self.cores is not None else cpus

    @property
    def intra_op_threads(self) -> int:
        return self.threads or len(self.cpus)

    @property
    def label(self) -> str:
        """The profile as a spec (`cores=1,memory=512MiB,threads=1`)."""
        parts = [f"cores={len(self.cpus)}"]
        if self.memory_bytes is not None:
            parts.append(f"memory={compact_size(self.memory_bytes)}")
        parts.append(f"threads={self.intra_op_threads}")
        return ",".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "cores": len(self.cpus), "cpus": self.cpus,
                "memory_bytes": self.memory_bytes, "threads": self.intra_op_threads}


# -- cgroup v2 -------------------------------------------------------------------------------


def cgroup2_dir(proc_cgroup: str, mounts: str) -> Path | None:
    """This process's cgroup v2 directory from /proc/self/cgroup and /proc/mounts text (pure):
    the `0::/path` line under the cgroup2 mount; None without either."""
    rel = next((ln[3:] for ln in proc_cgroup.splitlines() if ln.startswith("0::")), None)
    mount = next((f[1] for f in (ln.split() for ln in mounts.splitlines())
                  if len(f) > 2 and f[2] == "cgroup2"), None)
    if rel is None or mount is None:
        return None
    return Path(mount) / rel.lstrip("/")


def memory_cgroup_parent() -> tuple[Path | None, str]:
    """(the cgroup v2 directory a limited child cgroup can be made in, or None; why)."""
    try:
        base = cgroup2_dir(Path("/proc/self/cgroup").read_text(),
                           Path("/proc/mounts").read_text())
    except OSError as e:
        return None, f"cannot read /proc ({e})"
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted for this process"
    try:
        delegated = (base / "cgroup.subtree_control").read_text().split()
    except OSError as e:
        return None, f"{base}: {e.strerror}"
    if "memory" not in delegated:
        return None, (f"{base}: the memory controller is not delegated to child cgroups "
                      f"(cgroup.subtree_control: {' '.join(delegated) or 'empty'})")
    if not os.access(base, os.W_OK):
        return None, f"{base}: not writable by this user"
    return base, f"{base} delegates memory"


def choose_mechanism(profile: DeviceProfile) -> tuple[str, str]:
    """('cgroup2' | 'rlimit_as' | 'none', why) for the profile's memory limit."""
    if profile.memory_bytes is None:
        return "none", "no memory limit asked for"
    base, why = memory_cgroup_parent()
    if base is not None:
        return "cgroup2", why
    return "rlimit_as", f"cgroup v2 not usable ({why})"


# -- the limited run ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class LimitedRun:
    """How one command fared under a device profile."""

    fit: bool | None
    """True: ran to the end within the limits; False: the memory limit stopped it; None: it
    failed for another reason (see `reason`)."""
    reason: str
    """Why it did not fit or failed (the child's last error line); '' when it fit."""
    mechanism: str
    """How memory was limited: cgroup2, rlimit_as or none."""
    mechanism_note: str
    """Why that mechanism (e.g. why cgroup v2 could not be used)."""
    exit_code: int | None
    """The child's exit status (None when a signal ended it)."""
    signal: str | None
    """The signal that ended the child (e.g. SIGKILL from the OOM killer), if any."""
    stdout: str
    stderr_tail: str
    """The last lines the child wrote on stderr."""
    wall_s: float
    peak_rss_bytes: int | None
    """The child's own peak resident set (VmHWM), as it reported at exit (None if it died)."""
    peak_vm_bytes: int | None = None
    """The child's peak address space (VmPeak): what RLIMIT_AS limits (None if it died)."""
    cpus: list[int] | None = None
    """The CPUs the child saw in its affinity at exit (None if it died before reporting)."""
    threads: int | None = None
    """torch's intra-op threads in the child at exit (None: torch not loaded or no report)."""
    pid: int = 0
    """The child's process id (its session and process group id too)."""
    peak_cgroup_bytes: int | None = None
    """memory.peak of the child's cgroup (cgroup2 only, where the kernel has it)."""
    extras: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"fit": self.fit, "reason": self.reason, "mechanism": self.mechanism,
                "mechanism_note": self.mechanism_note, "exit_code": self.exit_code,
                "signal": self.signal, "wall_s": round(self.wall_s, 3),
                "peak_rss_bytes": self.peak_rss_bytes, "peak_vm_bytes": self.peak_vm_bytes,
                "cpus": self.cpus,
                "threads": self.threads, "peak_cgroup_bytes": self.peak_cgroup_bytes}


def _limits_env(profile: DeviceProfile) -> dict[str, str]:
    n = str(profile.intra_op_threads)
    # torch, OpenMP, MKL/OpenBLAS and ONNX Runtime's defaults follow these at start-up, so the
    # work sees the device's thread count without being told.
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
            "SCALELAB_DEVICE_THREADS": n}


def classify(returncode: int, stderr: str, oom_kills: int) -> tuple[bool | None, str]:
    """(fit, reason) from how the child ended (pure)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    if oom_kills > 0:
        return False, f"killed by the cgroup's OOM killer ({oom_kills} kill(s))"
    if returncode == 0:
        return True, ""
    for pat in NO_FIT_PATTERNS:
        hit = next((ln.strip() for ln in reversed(lines) if re.search(pat, ln)), None)
        if hit is not None:
            # An import that cannot map its library is often re-raised wrapped in an install
            # hint ("pip install ..."), which would mislead: name the library instead.
            lib = re.search(r"([^\s(/]+\.so[^\s:]*): failed to map segment", hit)
            if lib is not None:
                return False, ("the memory limit refused an allocation: cannot map "
                               f"{lib.group(1)} (failed to map segment from shared object)")
            return False, f"the memory limit refused an allocation: {_clean(hit)}"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if name == "SIGKILL":
            return False, "killed by SIGKILL (the kernel's OOM killer, most likely)"
        return None, f"ended by {name}" + (f": {_clean(last)}" if last else "")
    return None, f"exit {returncode}" + (f": {_clean(last)}" if last else "")


def _clean(line: str) -> str:
    # The scalelab CLI wraps an unexpected error as "error: internal error: X (set ...)".
    line = re.sub(r"^error: (internal error: )?", "", line)
    return re.sub(r"\s*\(set SCALELAB_DEBUG=1[^)]*\)$", "", line)[:300]


def run_limited(argv: list[str], profile: DeviceProfile, *, timeout_s: float = 600.0,
                env: dict[str, str] | None = None, cwd: Path | None = None) -> LimitedRun:
    """Run `python -m <argv...>` (e.g. ['scalelab', 'model', 'time', ...]) under `profile`.

    The child is pinned to `profile.cpus`, gets `profile.intra_op_threads` threads, is limited
    to `profile.memory_bytes` (see module docstring) and runs in its own session, whose whole
    process group is killed on timeout or when the caller is interrupted: nothing outlives it.
    """
    mechanism, note = choose_mechanism(profile)
    cpus = profile.cpus
    with tempfile.TemporaryDirectory(prefix="scalelab-device-") as tmp:
        report = Path(tmp) / "report.json"
        full_env = {**os.environ, **(env or {}), **_limits_env(profile),
                    REPORT_ENV: str(report)}
        cgroup: Path | None = None
        if mechanism == "cgroup2":
            base, _ = memory_cgroup_parent()
            assert base is not None
            cgroup = base / f"scalelab-device-{os.getpid()}-{time.monotonic_ns()}"
            try:
                cgroup.mkdir()
                (cgroup / "memory.max").write_text(str(profile.memory_bytes))
                if (cgroup / "memory.swap.max").exists():
                    (cgroup / "memory.swap.max").write_text("0")
            except OSError as e:
                _remove_cgroup(cgroup)
                cgroup, mechanism = None, "rlimit_as"
                note = f"cgroup v2 not usable ({base}: {e.strerror})"
        # The child applies the limits to itself first thing, before it imports anything
        # heavy or starts a thread (device_child.apply_limits): a preexec_fn would run Python
        # in a fork of this process, which is unsafe once torch has started its threads.
        full_env[CPUS_ENV] = ",".join(map(str, cpus))
        if cgroup is not None:
            full_env[CGROUP_ENV] = str(cgroup)
        elif mechanism == "rlimit_as" and profile.memory_bytes is not None:
            full_env[RLIMIT_ENV] = str(profile.memory_bytes)

        t0 = time.perf_counter()
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        try:
            # Files, not pipes: a process the work leaves behind would hold a pipe open and
            # keep us waiting for its EOF.
            with out_path.open("wb") as out_f, err_path.open("wb") as err_f:
                proc = subprocess.Popen(
                    [sys.executable, "-m", CHILD_MODULE, *argv], env=full_env, cwd=cwd,
                    stdout=out_f, stderr=err_f, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Whatever the work started in its session goes with it (and on an interrupt,
                # the work itself).
                _kill_group(proc)
            wall = time.perf_counter() - t0
            oom_kills, peak_cg = _cgroup_outcome(cgroup)
        finally:
            if cgroup is not None:
                _remove_cgroup(cgroup)
        out, err = out_path.read_bytes(), err_path.read_bytes()
        seen: dict[str, Any] = {}
        if report.exists():
            try:
                seen = json.loads(report.read_text())
            except ValueError:
                seen = {}
    stderr = err.decode(errors="replace")
    fit, reason = classify(proc.returncode, stderr, oom_kills)
    if timed_out:
        fit, reason = None, f"did not finish within {timeout_s:g} s (killed)"
    rc = proc.returncode
    return LimitedRun(
        fit=fit, reason=reason, mechanism=mechanism, mechanism_note=note,
        exit_code=rc if rc >= 0 else None,
        signal=signal.Signals(-rc).name if rc < 0 else None,
        stdout=out.decode(errors="replace"),
        stderr_tail="\n".join(stderr.strip().splitlines()[-8:]), wall_s=wall,
        peak_rss_bytes=seen.get("vm_hwm_bytes"), peak_vm_bytes=seen.get("vm_peak_bytes"),
        cpus=seen.get("cpus"),
        threads=seen.get("torch_threads"), pid=proc.pid, peak_cgroup_bytes=peak_cg)


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc."""
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command name: state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def _kill_group(proc: subprocess.Popen[bytes], *, grace_s: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # SIGKILL is delivered asynchronously: wait until the group's last member has died, so
    # that nothing the work started is still running when the caller reads the results.
    deadline = time.monotonic() + grace_s
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _cgroup_outcome(cgroup: Path | None) -> tuple[int, int | None]:
    if cgroup is None:
        return 0, None
    kills = 0
    try:
        for ln in (cgroup / "memory.events").read_text().splitlines():
            k, _, v = ln.partition(" ")
            if k == "oom_kill":
                kills = int(v)
    except OSError:
        pass
    try:
        peak: int | None = int((cgroup / "memory.peak").read_text())
    except (OSError, ValueError):
        peak = None
    return kills, peak


def _remove_cgroup(cgroup: Path) -> None:
    # The child and its group are gone (waited for); a cgroup can only be removed empty.
    for _ in range(50):
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
