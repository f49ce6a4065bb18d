"""Where the tests find the prometheus server binary: on PATH, or where `make test` put it
beside the venv's python (.ci/promtool extracts it from Debian's prometheus package with
promtool). Absent, a test that needs it skips and says why, except under
SCALELAB_REQUIRE_PROMTOOL (set by .ci/run), where it fails."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def prometheus() -> str:
    """The prometheus binary's path, or a skip (a failure where CI requires it)."""
    found = shutil.which("prometheus") or shutil.which(
        "prometheus", path=str(Path(sys.executable).parent))
    if found is not None:
        return found
    if os.environ.get("SCALELAB_REQUIRE_PROMTOOL"):
        pytest.fail("SCALELAB_REQUIRE_PROMTOOL is set but prometheus is absent: `make promtool` "
                    "extracts it from Debian's prometheus package (apt must work)")
    pytest.skip("prometheus absent and `make promtool` could not fetch it (no apt lists and "
                "not root); as root: apt-get update && make promtool (or apt-get install "
                "prometheus)")
