"""User-facing errors. `cli` alone turns them into exit codes and one-line messages."""

from __future__ import annotations

import importlib
from typing import Any


class ScalelabError(Exception):
    """A user mistake or bad input. The message says what is wrong, where, and how to fix it."""


class BadInputError(ScalelabError, ValueError):
    """A file, record, request or value that cannot be used as given."""


class BadUsageError(ScalelabError, ValueError):
    """Flags or arguments that contradict each other or are out of range."""


class RunFailedError(ScalelabError, RuntimeError):
    """A measured run (subprocess, server, training job) failed in a way the user must act on."""


def import_optional(module: str, *, needed_for: str, hint: str) -> Any:
    """`module` (an optional dependency an extra brings), imported where it is first needed, or
    a BadUsageError reading "<needed_for> (<the import error>); <hint>"."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BadUsageError(f"{needed_for} ({e}); {hint}") from None
