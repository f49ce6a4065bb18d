"""The serving level's peak memory is the server tree's peak while the level ran, not the
larger of two readings around it."""

import subprocess
import sys

from recordkit import rec
from scalelab.diagnose.stages.serve_meter import ServerMeter

MiB = 2**20
SPIKE = ("import sys, time\n"
         "sys.stdin.readline()\n"
         "b = bytearray(b'x') * (150 * 2**20); print('up', flush=True); time.sleep(0.6)\n"
         "del b; print('down', flush=True); time.sleep(30)\n")


def test_a_spike_between_the_readings_is_the_peak() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SPIKE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        # Nothing listens on port 9: the meter's /metrics reads fail fast and say nothing.
        meter = ServerMeter(pid=proc.pid, url="http://127.0.0.1:9", core_hour_usd=0.048,
                            duration_s=1.0)
        meter.start()  # before the spike: its reading is the idle interpreter
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "up"
        # Freed (munmap) before the level ends: the after-reading is the idle interpreter.
        assert proc.stdout.readline().strip() == "down"
        tagged = meter.tag(rec("serve", "rate", 40, wall_s=1.0))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert tagged.peak_memory_bytes is not None and tagged.peak_memory_bytes >= 150 * MiB
