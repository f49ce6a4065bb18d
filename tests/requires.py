"""Dev dependencies a test needs: skipped with the install hint on a developer's machine, a
failure in CI.

    tritonclient = requires("tritonclient.http")

Outside CI a missing dependency skips the module, naming what to install. With
SCALELAB_REQUIRE_DEPS=1 (`.ci/run` sets it, as SCALELAB_REQUIRE_PROMTOOL for promtool) it fails
the run instead: a broken install must not turn the tests that hold a guarantee into a pass.
Every package named here is in the `dev` extra, which `make test` installs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest

HINT = "make test installs it (pip install -c constraints.txt -e '.[dev]')"


def required() -> bool:
    """Whether a missing dev dependency fails the run (CI) rather than skipping."""
    return os.environ.get("SCALELAB_REQUIRE_DEPS") == "1"


def requires(name: str) -> ModuleType:
    """Import `name`; missing, skip (outside CI) or fail (SCALELAB_REQUIRE_DEPS=1)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        why = f"{name} is not installed ({e}); {HINT}"
        if required():
            pytest.fail(f"SCALELAB_REQUIRE_DEPS=1: {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)


def have(*names: str) -> bool:
    """Whether every module in `names` can be imported, for tests that cover less without
    them: missing, False outside CI, a failure with SCALELAB_REQUIRE_DEPS=1 (every one named
    here is installed by `make test`)."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing and required():
        pytest.fail(f"SCALELAB_REQUIRE_DEPS=1: {', '.join(missing)} not installed; {HINT}",
                    pytrace=False)
    return not missing
