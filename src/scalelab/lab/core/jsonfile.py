"""Reading a JSON object or a JSON Lines file, with the one standard error when it can't be used.

Every reader of a JSON document the user may have touched (a config, a manifest, a schema, a
stored result) goes through here, so a missing file, bad JSON or a wrong top level gives the
same message everywhere: the path, what is wrong (line and column for bad JSON) and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError


def _fix(fix: str) -> str:
    return f"; {fix}" if fix else ""


def parse_json_object(text: str, where: str, *, fix: str = "") -> dict[str, Any]:
    """`text` as a JSON object; `where` names it in the error (a path, `path:line`)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}){_fix(fix)}"
        ) from None
    if not isinstance(obj, dict):
        raise BadInputError(
            f"{where}: must hold a JSON object, not {type(obj).__name__}{_fix(fix)}"
        )
    return obj


def _text(path: Path, fix: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInputError(f"{path} does not exist{_fix(fix)}") from None
    except IsADirectoryError:
        raise BadInputError(f"{path} is a directory, not a JSON file{_fix(fix)}") from None
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not UTF-8 text ({e.reason}){_fix(fix)}") from None
    except OSError as e:
        raise BadInputError(f"{path}: cannot be read ({e.strerror}){_fix(fix)}") from None


def read_json_object(path: str | os.PathLike[str], *, fix: str = "") -> dict[str, Any]:
    """The JSON object stored at `path`; BadInputError (path, problem, `fix`) otherwise."""
    p = Path(path)
    return parse_json_object(_text(p, fix), str(p), fix=fix)


def read_jsonl_objects(
    path: str | os.PathLike[str], *, fix: str = ""
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSON Lines file."""
    p = Path(path)
    for lineno, line in enumerate(_text(p, fix).splitlines(), start=1):
        if line.strip():
            yield lineno, parse_json_object(line, f"{p}:{lineno}", fix=fix)
