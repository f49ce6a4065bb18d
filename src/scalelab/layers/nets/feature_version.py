"""Feature versions: a digest of the preprocess vocabularies and statistics a model was fitted
with, so a model is never paired with features encoded another way.

preprocess.json (vocabulary per categorical column, mean/std per numeric column, class names) is
the whole encoding; its version is the sha256 of that content in canonical JSON (sorted keys, no
spaces; floats as Python writes them, which round-trip exactly), so it is the same whoever wrote
the file. A model version records the feature version it was trained on in model.json
(`feature_version`); `mismatch` says why a version directory pairs the two wrongly, and the
server refuses to load such a version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalelab.layers.nets.repository import PREPROCESS_FILE

KEY = "feature_version"
"""The model.json field holding the feature version the weights were trained on."""


def feature_version(preprocess: Mapping[str, Any]) -> str:
    """'fv1-' + 16 hex digits of the sha256 of the encoding's canonical JSON (pure)."""
    content = {k: preprocess.get(k) for k in ("categorical", "numeric", "classes")}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "fv1-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def mismatch(version_dir: str | Path) -> str | None:
    """Why VERSION_DIR's model and preprocess.json do not belong together, or None.

    None also when model.json records no feature version (models from before feature versions
    are served as they were)."""
    d = Path(version_dir)
    try:
        spec = json.loads((d / "model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading the model reports a missing or broken model.json itself
    want = spec.get(KEY) if isinstance(spec, dict) else None
    if want is None:
        return None
    try:
        pre = json.loads((d / PREPROCESS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return (f"model.json records feature version {want} but {d / PREPROCESS_FILE} is "
                "missing; copy the preprocess.json the model was trained with")
    except (OSError, ValueError) as e:
        return f"{d / PREPROCESS_FILE} is not readable JSON ({e})"
    if not isinstance(pre, dict):
        return f"{d / PREPROCESS_FILE} must hold a JSON object"
    have = feature_version(pre)
    if have != want:
        return (f"feature version mismatch: the model was trained on {want} but "
                f"{PREPROCESS_FILE} encodes {have}; serve it with the preprocess.json it was "
                "trained with, or retrain it on these features")
    return None
