"""`python -m scalelab.lab.core.device_child MODULE ARGS...`: hold this process to the limits the
parent put in the environment (CPU affinity, a cgroup v2 to join or an RLIMIT_AS), run MODULE as
`python -m MODULE ARGS`, and, as the process exits (normally, by an exception or sys.exit),
write what it saw of itself to $SCALELAB_DEVICE_REPORT: its CPU affinity, torch's thread count,
its peak RSS (VmHWM) and peak address space (VmPeak).

The limits are applied here, before anything heavy is imported or any thread started, rather
than by the parent between fork and exec (preexec_fn), which is unsafe in a parent that runs
threads (torch's).

The child reports its own peak because the parent cannot measure it: a child's ru_maxrss
includes the pages of the parent it was forked from (Linux carries the high-water mark across
exec), so a 500 MB parent would make every child look 500 MB big.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import runpy
import sys
from pathlib import Path
from typing import Any

REPORT_ENV = "SCALELAB_DEVICE_REPORT"
CPUS_ENV = "SCALELAB_DEVICE_CPUS"
"""Comma-separated CPU ids to pin this process to."""
CGROUP_ENV = "SCALELAB_DEVICE_CGROUP"
"""A cgroup v2 directory (with memory.max set) to move this process into."""
RLIMIT_ENV = "SCALELAB_DEVICE_RLIMIT_AS"
"""Address-space limit in bytes (where no cgroup is used)."""


def apply_limits(env: dict[str, str]) -> None:
    """Pin, join the cgroup or set RLIMIT_AS, as `env` says (the parent's instructions)."""
    if env.get(CPUS_ENV):
        os.sched_setaffinity(0, [int(c) for c in env[CPUS_ENV].split(",")])
    if env.get(CGROUP_ENV):
        (Path(env[CGROUP_ENV]) / "cgroup.procs").write_text(str(os.getpid()))
    elif env.get(RLIMIT_ENV):
        limit = int(env[RLIMIT_ENV])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def vm_hwm_bytes(status: str, field: str = "VmHWM") -> int | None:
    """Peak resident set (or another kB `field`, e.g. VmPeak: peak address space) from
    /proc/<pid>/status text (pure)."""
    for ln in status.splitlines():
        if ln.startswith(field + ":"):
            return int(ln.split()[1]) * 1024
    return None


def _report() -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    seen: dict[str, Any] = {"cpus": sorted(os.sched_getaffinity(0))}
    torch = sys.modules.get("torch")
    if torch is not None:
        seen["torch_threads"] = int(torch.get_num_threads())
    with contextlib.suppress(OSError):
        status = Path("/proc/self/status").read_text()
        seen["vm_hwm_bytes"] = vm_hwm_bytes(status)
        seen["vm_peak_bytes"] = vm_hwm_bytes(status, "VmPeak")
    Path(path).write_text(json.dumps(seen))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m scalelab.lab.core.device_child MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    apply_limits(dict(os.environ))
    atexit.register(_report)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
