"""What machine a measurement was taken on: recorded beside every number."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from functools import lru_cache

import psutil


@dataclass(frozen=True, kw_only=True)
class Machine:
    """The resources a measurement had; every record carries one."""

    cores: int
    """CPU cores this process may run on (affinity), not the host's total."""
    memory_bytes: int
    """Physical memory of the host."""
    device: str
    """'cpu: <model>' or 'cuda: <name>' for the device the stage computed on."""
    hostname: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def available_cores() -> int:
    """Cores this process may use; containers and taskset shrink this below os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=4)
def current_machine(device: str | None = None) -> Machine:
    """Describe this host; `device` overrides the device string (e.g. 'cuda: NVIDIA H200')."""
    return Machine(
        cores=available_cores(),
        memory_bytes=int(psutil.virtual_memory().total),
        device=device or f"cpu: {_cpu_model()}",
        hostname=platform.node(),
    )
