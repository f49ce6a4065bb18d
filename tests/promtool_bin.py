"""Where the tests find promtool: on PATH, or where `make test` put it (beside the venv's
python). Absent, a test that needs it skips and says why, except under
SCALELAB_REQUIRE_PROMTOOL (set by .ci/run), where it fails: CI always runs the promtool checks."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def promtool() -> str:
    """The promtool binary's path, or a skip (a failure where CI requires it)."""
    found = shutil.which("promtool") or shutil.which(
        "promtool", path=str(Path(sys.executable).parent))
    if found is not None:
        return found
    if os.environ.get("SCALELAB_REQUIRE_PROMTOOL"):
        pytest.fail("SCALELAB_REQUIRE_PROMTOOL is set but promtool is absent: `make promtool` "
                    "extracts it from Debian's prometheus package (apt must work)")
    pytest.skip("promtool absent and `make promtool` could not fetch it (no apt lists and not "
                "root); as root: apt-get update && make promtool")
