"""The deterministic OpenAI-compatible test server (tests/load/llm_server.py), started for a test.

    with llm_server("--ttft-ms", "20", "--gap-ms", "10") as url: ...

yields its base URL once it listens on 127.0.0.1 and kills it afterwards, whatever the test did.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SERVER = Path(__file__).parent / "load" / "llm_server.py"


@contextlib.contextmanager
def llm_server(*args: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"llm test server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
