"""Device profiles: the spec parser (exact errors), the pure helpers, and real children held to a
profile (affinity, memory limit, nothing left behind)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalelab.lab.core.device import (
    DeviceProfile,
    cgroup2_dir,
    classify,
    compact_size,
    group_members,
    run_limited,
)
from scalelab.lab.core.device_child import vm_hwm_bytes
from scalelab.lab.core.errors import BadUsageError, ScalelabError

CPUS = sorted(os.sched_getaffinity(0))


def test_parse_full_spec() -> None:
    p = DeviceProfile.parse("cores=1, memory=512MiB,threads=2")
    assert (p.cores, p.memory_bytes, p.threads) == (1, 512 * 2**20, 2)
    assert p.cpus == CPUS[:1]
    assert p.intra_op_threads == 2
    assert p.label == "cores=1,memory=512MiB,threads=2"


def test_threads_default_to_cores_and_label_round_trips() -> None:
    p = DeviceProfile.parse("memory=1536KiB")
    assert p.cores is None and p.cpus == CPUS and p.intra_op_threads == len(CPUS)
    assert DeviceProfile.parse(p.label).memory_bytes == 1536 * 1024
    assert compact_size(1000) == "1000B" and compact_size(3 << 30) == "3GiB"


@pytest.mark.parametrize(("spec", "message"), [
    ("cores=1,mem=1GiB", "--device 'cores=1,mem=1GiB': unknown key 'mem'; use cores, memory, "
                         "threads (e.g. cores=1,memory=512MiB)"),
    ("cores", "--device 'cores': 'cores' is not key=value; e.g. --device cores=1,memory=512MiB"),
    ("cores=one", "--device cores='one': give a whole number"),
    ("cores=1,cores=2", "--device 'cores=1,cores=2': cores given twice"),
    ("", "--device '': give e.g. cores=1,memory=512MiB"),
    ("cores=0", f"--device cores=0: this machine lets scalelab use {len(CPUS)} CPU(s); give "
                f"cores=1..{len(CPUS)}"),
    (f"cores={len(CPUS) + 1}", f"--device cores={len(CPUS) + 1}: this machine lets scalelab use "
                               f"{len(CPUS)} CPU(s); give cores=1..{len(CPUS)}"),
    ("threads=0", "--device threads=0: give threads >= 1"),
    ("memory=1000B", "--device memory=1000B: give at least 1MiB"),
])
def test_bad_specs_say_what_and_how(spec: str, message: str) -> None:
    with pytest.raises(BadUsageError) as e:
        DeviceProfile.parse(spec)
    assert str(e.value) == message


def test_bad_size_names_the_key() -> None:
    with pytest.raises(ScalelabError) as e:  # exit 2 like every bad flag
        DeviceProfile.parse("memory=lots")
    assert str(e.value) == ("--device memory: 'lots' is not a size; write e.g. 512MiB, 2GiB, "
                            "1000000")


def test_cgroup2_dir_from_proc_text() -> None:
    mounts = ("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    assert cgroup2_dir("4:memory:/x\n0::/a/b\n", mounts) == Path("/sys/fs/cgroup/unified/a/b")
    assert cgroup2_dir("0::/\n", mounts) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_dir("4:memory:/x\n", mounts) is None
    assert cgroup2_dir("0::/\n", "proc /proc proc rw 0 0\n") is None


def test_classify_exit_paths() -> None:
    assert classify(0, "", 0) == (True, "")
    assert classify(-9, "", 2) == (False, "killed by the cgroup's OOM killer (2 kill(s))")
    assert classify(1, "Traceback ...\nMemoryError\n", 0) == (
        False, "the memory limit refused an allocation: MemoryError")
    assert classify(70, "error: internal error: ImportError: libx.so: failed to map segment "
                        "from shared object (set SCALELAB_DEBUG=1 for the traceback)\n", 0) == (
        False, "the memory limit refused an allocation: cannot map libx.so (failed to map "
               "segment from shared object)")
    assert classify(2, "error: ONNX models need onnxruntime (/v/lib/onnxruntime_pybind11_state"
                       ".cpython-311-x86_64-linux-gnu.so: failed to map segment from shared "
                       "object); pip install onnxruntime\n", 0) == (
        False, "the memory limit refused an allocation: cannot map onnxruntime_pybind11_state"
               ".cpython-311-x86_64-linux-gnu.so (failed to map segment from shared object)")
    assert classify(1, "MemoryError: Cannot allocate memory (os error 12)\n", 0) == (
        False, "the memory limit refused an allocation: MemoryError: Cannot allocate memory "
               "(os error 12)")
    assert classify(-9, "", 0) == (False, "killed by SIGKILL (the kernel's OOM killer, most "
                                          "likely)")
    assert classify(2, "error: --model 'x': bad\n", 0) == (None, "exit 2: --model 'x': bad")
    assert classify(-15, "", 0) == (None, "ended by SIGTERM")


def test_vm_hwm_from_status_text() -> None:
    assert vm_hwm_bytes("Name:\tpython\nVmHWM:\t  265612 kB\nVmRSS:\t1 kB\n") == 265612 * 1024
    assert vm_hwm_bytes("VmPeak:\t  785 kB\nVmHWM:\t 2 kB\n", "VmPeak") == 785 * 1024
    assert vm_hwm_bytes("Name:\tpython\n") is None


def test_child_runs_on_one_cpu_and_reports_itself() -> None:
    run = run_limited(["scalelab", "--version"], DeviceProfile.parse("cores=1"))
    assert run.fit is True and run.exit_code == 0 and run.reason == ""
    assert run.mechanism == "none"
    assert run.cpus == CPUS[:1]
    assert "scalelab" in run.stdout
    assert run.peak_rss_bytes is not None and run.peak_rss_bytes > 1 << 20
    assert run.peak_vm_bytes is not None and run.peak_vm_bytes >= run.peak_rss_bytes
    assert group_members(run.pid) == []


def test_far_too_little_memory_is_no_fit_not_a_traceback() -> None:
    # 48 MiB of address space: the interpreter starts, importing torch's libraries cannot.
    run = run_limited(["scalelab", "generate", "complete", "x", "--model", "tiny", "--json"],
                      DeviceProfile.parse("cores=1,memory=48MiB"))
    assert run.fit is False
    assert run.mechanism in ("cgroup2", "rlimit_as")
    assert run.reason.startswith(("the memory limit refused an allocation: ",
                                  "killed by the cgroup's OOM killer"))
    assert "Traceback" not in run.reason
    assert run.stdout == ""
    assert group_members(run.pid) == []


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_what_the_child_started_goes_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    # timeit runs a statement: start a grandchild that would sleep a minute, then exit.
    stmt = (f"import subprocess; p=subprocess.Popen(['sleep','60']); "
            f"open({str(pidfile)!r},'w').write(str(p.pid))")
    run = run_limited(["timeit", "-n", "1", "-r", "1", stmt], DeviceProfile.parse("cores=1"))
    assert run.fit is True, run.stderr_tail
    grandchild = int(pidfile.read_text())
    assert _state(grandchild) in (None, "Z")  # gone, or dead and awaiting its reaper
    assert group_members(run.pid) == []


def test_timeout_kills_the_child() -> None:
    run = run_limited(["timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"],
                      DeviceProfile.parse("cores=1"), timeout_s=1.0)
    assert run.fit is None
    assert run.reason == "did not finish within 1 s (killed)"
    assert run.signal == "SIGKILL" and run.exit_code is None
