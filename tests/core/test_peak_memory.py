"""Peak resident memory per piece of work: a later, smaller piece does not read an earlier
piece's peak, and a child process's memory counts."""

import subprocess
import sys

from scalelab.core.peak_memory import PeakMemory, high_water, reset_high_water

MiB = 2**20


def _touch(n: int) -> bytearray:
    return bytearray(b"\x01") * n  # written, so every page is resident


def test_a_later_smaller_piece_reads_its_own_peak() -> None:
    with PeakMemory() as big:
        buf = _touch(200 * MiB)
        del buf
    with PeakMemory() as small:
        buf = _touch(20 * MiB)
        del buf
    assert big.peak_bytes >= small.peak_bytes + 150 * MiB, (big.peak_bytes, small.peak_bytes)


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
