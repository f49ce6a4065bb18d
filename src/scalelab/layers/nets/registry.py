"""Architectures by name, so a model version on disk (model.json + safetensors) can be rebuilt.

Weights are safetensors only: loading never unpickles anything. torch is imported where a
module is built, saved or loaded, not here: `scalelab diagnose` reads and writes model.json
through this module and never runs a net itself (importing torch cost it ~1.7 s at start).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object

if TYPE_CHECKING:
    from torch import nn

WEIGHTS_FILE = "model.safetensors"
SPEC_FILE = "model.json"

Builder = Callable[[dict[str, Any]], "nn.Module"]

def _tabular(params: dict[str, Any]) -> nn.Module:
    from scalelab.layers.nets.tabular import TabularConfig, TabularNet

    return TabularNet(TabularConfig(**params))


def _listed() -> dict[str, Builder]:
    """Every architecture the shared layer defines, by an explicit list (imported here, not
    registered by importing the modules: their builders call back into this registry)."""
    from scalelab.layers.nets import folded, variants

    return {"tabular_mlp": _tabular, folded.ARCH: folded.build_folded,
            **variants.builders(build)}


_ARCHITECTURES: dict[str, Builder] = {}
"""The listed architectures (filled on first use) plus those a part registers."""


def _known() -> dict[str, Builder]:
    if "tabular_mlp" not in _ARCHITECTURES:
        _ARCHITECTURES.update({**_listed(), **_ARCHITECTURES})
    return _ARCHITECTURES


def register(name: str, builder: Builder) -> None:
    """Add a part's own architecture (e.g. serve's fault-injection nets); its builder takes the
    `params` dict stored in model.json. The shared layer's own are listed in `_listed`."""
    _ARCHITECTURES[name] = builder


def architectures() -> list[str]:
    return sorted(_known())


def build(arch: str, params: dict[str, Any]) -> nn.Module:
    known = _known()
    if arch not in known:
        raise BadInputError(f"unknown architecture {arch!r}; known: {', '.join(architectures())}")
    try:
        return known[arch](params)
    except TypeError as e:
        raise BadInputError(f"bad parameters for architecture {arch!r}: {e}") from e


def save_module(
    directory: str | Path,
    module: nn.Module,
    *,
    arch: str,
    params: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write model.json (architecture, params, extra) and model.safetensors into `directory`."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(d / WEIGHTS_FILE))
    write_spec(d, arch=arch, params=params, extra=extra)


def write_spec(
    directory: str | Path,
    *,
    arch: str,
    params: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write model.json: which architecture rebuilds the weights beside it, with what params."""
    spec = {"architecture": arch, "params": params, **(extra or {})}
    text = json.dumps(spec, indent=2) + "\n"
    (Path(directory) / SPEC_FILE).write_text(text, encoding="utf-8")


def read_spec(directory: str | Path) -> dict[str, Any]:
    p = Path(directory) / SPEC_FILE
    spec = read_json_object(
        p, fix=f"a model version needs {SPEC_FILE} and {WEIGHTS_FILE}; re-export the model"
    )
    if "architecture" not in spec or not isinstance(spec.get("params"), dict):
        raise BadInputError(f"{p} must be an object with 'architecture' and 'params'")
    return spec


def load_module(directory: str | Path, *, device: str = "cpu") -> nn.Module:
    """Rebuild a module from model.json and load its safetensors weights (no pickle involved)."""
    from safetensors.torch import load_file

    from scalelab.layers.nets import onnx

    d = Path(directory)
    spec = read_spec(d)
    if spec["architecture"] == onnx.ARCH:
        return onnx.load(d, spec["params"]).eval()
    module = build(spec["architecture"], spec["params"])
    w = d / WEIGHTS_FILE
    if not w.is_file():
        raise BadInputError(f"{w} is missing; a model version needs {WEIGHTS_FILE}")
    try:
        state = load_file(str(w), device=device)
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise BadInputError(f"{w} is not a readable safetensors file ({e})") from e
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise BadInputError(f"{w} does not match the architecture in {SPEC_FILE}: {e}") from e
    return module.eval()
