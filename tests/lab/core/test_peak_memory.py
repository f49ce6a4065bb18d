"""Peak resident memory per piece of work: a later, smaller piece does not read an earlier
piece's peak, and a child process's memory counts."""

import subprocess
import sys

from scalelab.lab.core.peak_memory import PeakMemory, high_water, reset_high_water

MiB = 2**20


def _touch(n: int) -> bytearray:
    return bytearray(b"\x01") * n  # written, so every page is resident


PIECES = """
from scalelab.lab.core.peak_memory import PeakMemory
MiB = 2**20
with PeakMemory() as big:
    buf = bytearray(b"\\x01") * (200 * MiB)
    del buf
with PeakMemory() as small:
    buf = bytearray(b"\\x01") * (20 * MiB)
    del buf
print(big.peak_bytes, small.peak_bytes)
"""


def test_a_later_smaller_piece_reads_its_own_peak() -> None:
    # A fresh interpreter: a test worker's own children (servers other tests left running in
    # it) would be part of its process tree and of both peaks.
    out = subprocess.run([sys.executable, "-c", PIECES], capture_output=True, text=True,
                         check=True).stdout
    big, small = (int(x) for x in out.split())
    assert big >= small + 150 * MiB, (big, small)


def test_the_high_water_mark_resets_where_the_kernel_allows() -> None:
    buf = _touch(100 * MiB)
    del buf
    before = high_water()
    assert before is not None and before >= 100 * MiB
    # Linux ≥ 4.0 lets a process reset its own mark (CI and this machine run Linux).
    assert reset_high_water()
    after = high_water()
    assert after is not None and after <= before - 80 * MiB


def test_a_childs_memory_counts() -> None:
    with PeakMemory() as m:
        subprocess.run([sys.executable, "-c",
                        "import time; b = bytearray(b'x') * (150 * 2**20); time.sleep(0.5)"],
                       check=True)
    assert m.peak_bytes >= 150 * MiB
