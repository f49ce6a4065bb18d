"""`python -m scalelab.core.device_child MODULE ARGS...`: run MODULE as `python -m MODULE ARGS`
and, as the process exits (normally, by an exception or sys.exit), write what it saw of itself
to $SCALELAB_DEVICE_REPORT: its CPU affinity, torch's thread count and its peak RSS (VmHWM).

The child reports its own peak because the parent cannot measure it: a child's ru_maxrss
includes the pages of the parent it was forked from (Linux carries the high-water mark across
exec), so a 500 MB parent would make every child look 500 MB big.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

REPORT_ENV = "SCALELAB_DEVICE_REPORT"


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
        sys.exit("usage: python -m scalelab.core.device_child MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    atexit.register(_report)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
