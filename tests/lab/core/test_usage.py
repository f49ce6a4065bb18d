"""CPU busy cores and I/O wait from the kernel's counters."""

import resource
import subprocess
import sys
from pathlib import Path

from scalelab.lab.core.usage import (
    UsageMeter,
    busy_cores,
    busy_ticks,
    iowait_share,
    iowait_ticks,
    sched_times,
)


def test_iowait_from_a_proc_stat_file(tmp_path: Path) -> None:
    p = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    p.write_text("cpu  100 0 50 800 40 0 10 0 7 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert iowait_ticks(p) == (40, 1000)  # guests are already inside user/nice
    assert iowait_share((40, 1000), (70, 1200)) == 30 / 200
    assert iowait_share((40, 1000), (40, 1000)) is None
    assert iowait_ticks(tmp_path / "none") is None
    p.write_text("intr 1 2 3\n")
    assert iowait_ticks(p) is None


def test_machine_busy_cores_from_a_proc_stat_file(tmp_path: Path) -> None:
    p = tmp_path / "stat"
    p.write_text("cpu  100 0 50 800 40 0 10 0 7 0\ncpu0 1 2 3 4 5 6 7 8\n"
                 "cpu1 1 2 3 4 5 6 7 8\ncpufreq 9\nintr 1\n")
    # busy = total 1000 - idle 800 - iowait 40; two cpuN lines (cpufreq is not one).
    assert busy_ticks(p) == (160, 1000, 2)
    assert busy_cores((160, 1000, 2), (310, 1200, 2)) == 150 / 200 * 2
    assert busy_cores((160, 1000, 2), (160, 1000, 2)) is None
    assert busy_cores(None, (160, 1000, 2)) is None
    assert busy_ticks(tmp_path / "none") is None


def test_run_queue_wait_from_a_schedstat_file(tmp_path: Path) -> None:
    p = tmp_path / "schedstat"
    p.write_text("1500000000 250000000 42\n")  # ns on CPU, ns waiting on a run queue, slices
    assert sched_times(p) == (1.5, 0.25)
    p.write_text("")
    assert sched_times(p) is None
    assert sched_times(tmp_path / "none") is None


def test_children_cpu_time_is_counted() -> None:
    def children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    before = children_cpu()
    with UsageMeter() as m:
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"],
                       check=True)
    child = children_cpu() - before
    u = m.usage
    # the child's own CPU (the kernel's count) is in the meter's: the parent, waiting, adds
    # little, so a meter that left children out would read far less than the child used
    assert child > 0.05 and u.wall_s > 0
    assert u.cpu_s >= child * 0.99, (u.cpu_s, child)
    assert u.busy_cores == u.cpu_s / u.wall_s
    assert u.extras() == {"cpu_s": u.cpu_s}
    res = u.resources(comm_share=0.25)
    assert res.cpu_busy_cores == u.busy_cores and res.comm_share == 0.25
