"""Where the tests find Prometheus's binaries (promtool, and the prometheus server): on PATH,
or where `make test` put them beside the venv's python (.ci/promtool extracts both from Debian's
prometheus package). Absent, a test that needs one skips and says why, except under
SCALELAB_REQUIRE_PROMTOOL (set by .ci/run), where it fails: CI always runs these checks."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def binary(name: str) -> str:
    """The path of `name` ("promtool" or "prometheus"), or a skip (a failure where CI
    requires it)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is not None:
        return found
    if os.environ.get("SCALELAB_REQUIRE_PROMTOOL"):
        pytest.fail(f"SCALELAB_REQUIRE_PROMTOOL is set but {name} is absent: `make promtool` "
                    "extracts it from Debian's prometheus package (apt must work)")
    pytest.skip(f"{name} absent and `make promtool` could not fetch it (no apt lists and not "
                "root); as root: apt-get update && make promtool (or apt-get install "
                "prometheus)")


def promtool() -> str:
    return binary("promtool")


def prometheus() -> str:
    return binary("prometheus")
