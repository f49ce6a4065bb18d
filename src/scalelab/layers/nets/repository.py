"""The model repository layout, Triton-like, served by `scalelab serve`:

    REPO/<model>/config.json            inputs, outputs, batching, version policy
    REPO/<model>/<version>/model.json   architecture and params (see registry.py)
    REPO/<model>/<version>/model.safetensors
    REPO/<model>/<version>/manifest.json  lineage: datasets it came from, code, metrics
    REPO/<model>/<version>/...          anything else the model needs (e.g. preprocess.json)

Model names are [A-Za-z0-9_.-]+ without '..'; versions are positive integers; resolved paths must
stay inside REPO (symlinks out of it are refused).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object
from scalelab.layers.lineage.manifest import atomic_write_bytes

CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"
PREPROCESS_FILE = "preprocess.json"
"""The encoding of a model version, beside its weights: REPO/<model>/<version>/preprocess.json."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def check_model_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise BadInputError(
            f"model name {name!r} is not allowed; use letters, digits, '_', '-', '.' (no '..')"
        )
    return name


def check_version(version: str | int) -> int:
    s = str(version)
    if not s.isdigit() or int(s) < 1:
        raise BadInputError(f"model version {version!r} is not a positive integer")
    return int(s)


def inside(root: Path, path: Path) -> Path:
    """Resolve `path` and refuse it unless it stays under `root` (follows symlinks)."""
    r = root.resolve()
    p = path.resolve()
    if p != r and r not in p.parents:
        raise BadInputError(f"{path} resolves outside the model repository {root}; refused")
    return p


def model_dir(repo: str | Path, name: str) -> Path:
    root = Path(repo)
    return inside(root, root / check_model_name(name))


def version_dir(repo: str | Path, name: str, version: str | int) -> Path:
    root = Path(repo)
    return inside(root, root / check_model_name(name) / str(check_version(version)))


def versions(repo: str | Path, name: str) -> list[int]:
    d = model_dir(repo, name)
    if not d.is_dir():
        return []
    return sorted(
        int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    )


def next_version(repo: str | Path, name: str) -> int:
    vs = versions(repo, name)
    return (vs[-1] + 1) if vs else 1


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically and durably, so a reader (or a crash) never sees half a file."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def read_json(path: Path) -> dict[str, Any]:
    """A repository file's JSON object (config.json, serving.json, preprocess.json)."""
    return read_json_object(path, fix="re-export the model or fix the file")
