"""Publishing variants as new versions of a model in the serving repository.

Each version gets model.json + model.safetensors (rebuildable by `nets.registry.load_module`;
int8 variants store int8 weights + scales, see nets/variants.py), the parent's preprocess.json,
and a manifest.json: the parent version and its content digest, the technique, its parameters
and the measured quality. A version is written into a hidden temp directory and renamed into
place, so the server never sees half a version; the model's config.json is left as it is (or
copied from the parent's model when absent). With a lineage store, the edge parent -> variant
is recorded after the rename.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.manifest import code_version, dir_digest
from scalelab.layers.nets import onnx, registry
from scalelab.layers.nets.flights import PREPROCESS_FILE
from scalelab.layers.nets.onnx import OnnxNet
from scalelab.layers.nets.repository import (
    CONFIG_FILE,
    MANIFEST_FILE,
    check_model_name,
    model_dir,
    next_version,
    version_dir,
    write_json,
)
from scalelab.layers.nets.variants import Int8Module


def write_model_files(directory: Path, module: nn.Module, *, arch: str,
                      params: dict[str, Any]) -> None:
    """model.json + weights for any variant: model.safetensors (int8 ones as int8 tensors +
    scales), or model.onnx for a graph run by ONNX Runtime."""
    if isinstance(module, Int8Module | OnnxNet):
        directory.mkdir(parents=True, exist_ok=True)
        if isinstance(module, OnnxNet):
            onnx.save(directory, module)
        else:
            save_file(module.int8_state(), str(directory / registry.WEIGHTS_FILE))
        spec = {"architecture": arch, "params": params}
        (directory / registry.SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n",
                                                   encoding="utf-8")
    else:
        registry.save_module(directory, module.cpu(), arch=arch, params=params)


def files_size(directory: Path) -> int:
    """Bytes of the model files (model.json + weights) in a version directory."""
    return sum((directory / f).stat().st_size
               for f in (registry.SPEC_FILE, registry.WEIGHTS_FILE, onnx.FILE)
               if (directory / f).is_file())


@dataclass(frozen=True, kw_only=True)
class Published:
    name: str
    version: int
    path: Path
    lineage_node: int | None


def publish(repo: Path, model_name: str, *, parent_dir: Path, module: nn.Module, arch: str,
            params: dict[str, Any], technique: str, parameters: dict[str, Any],
            quality: dict[str, Any], lineage: Path | None = None,
            record_lineage: bool = True) -> Published:
    """Write one variant as the next version of REPO/MODEL_NAME (see module docstring)."""
    check_model_name(model_name)
    mdir = model_dir(repo, model_name)
    mdir.mkdir(parents=True, exist_ok=True)
    cfg = mdir / CONFIG_FILE
    if not cfg.is_file():
        parent_cfg = parent_dir.parent / CONFIG_FILE
        if not parent_cfg.is_file():
            raise BadInputError(
                f"{cfg} is missing and the parent model has none to copy ({parent_cfg}); "
                "publish into a repository that already serves the model, or write its config")
        shutil.copyfile(parent_cfg, cfg)
    parent_digest, _ = dir_digest(parent_dir)
    tmp = mdir / f".publish-{secrets.token_hex(4)}"
    try:
        write_model_files(tmp, module, arch=arch, params=params)
        pre = parent_dir / PREPROCESS_FILE
        if pre.is_file():
            shutil.copyfile(pre, tmp / PREPROCESS_FILE)
        parent_version = parent_dir.name
        manifest = {
            "kind": "model",
            "model": model_name,
            "parent": {"path": str(parent_dir.resolve()), "version": parent_version,
                       "digest": parent_digest},
            "technique": technique,
            "parameters": parameters,
            "quality": quality,
            "architecture": arch,
            "code": code_version(),
        }
        write_json(tmp / MANIFEST_FILE, manifest)
        for _ in range(100):
            v = next_version(repo, model_name)
            dst = version_dir(repo, model_name, v)
            try:
                os.rename(tmp, dst)  # atomic; fails if another writer took this number
                break
            except OSError:
                if not dst.exists():
                    raise
        else:
            raise BadInputError(f"could not claim a new version under {mdir}; retry")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    node = None
    if record_lineage:
        from scalelab.layers.lineage.store import LineageStore

        node = LineageStore(lineage).record(output=dst, inputs=[parent_dir], kind="model").id
    return Published(name=model_name, version=v, path=dst, lineage_node=node)
