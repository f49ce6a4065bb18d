"""A trained flights model into the serving repository: REPO/<name>/<next version>/.

Writes model.json + model.safetensors (nets.registry), preprocess.json (vocabularies, numeric
mean/std, classes: the server's input encoding), manifest.json (the datasets it was trained on,
by content digest, lineage.manifest; code version; parameters; held-out metrics; registered as
a node with dataset -> model edges in lineage.store) and, when absent, the model-level
config.json of the feature contract. The version folder is built under a temporary name and
renamed into place, so the server never sees a half-written version.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from torch import nn

from scalelab.layers.lineage.manifest import Manifest, dir_digest, file_entry
from scalelab.layers.nets import registry, repository
from scalelab.layers.nets.flights import CLASSES, Preprocess, serving_config
from scalelab.layers.nets.tabular import TabularConfig
from scalelab.system.train.dataset import Source

ARCH = "tabular_mlp"


def register_lineage(version_dir: Path, sources: list[Source], store_path: str | None) -> int:
    """Record the model version and its dataset -> model edges in the lineage store."""
    from scalelab.layers.lineage.store import LineageStore

    node = LineageStore(store_path).record(output=version_dir, inputs=[s.path for s in sources],
                                           kind="model")
    return node.id


def save_version(*, repo: str | Path, name: str, net: nn.Module, net_config: TabularConfig,
                 preprocess: Preprocess, sources: list[Source], params: dict[str, Any],
                 metrics: dict[str, Any], training: dict[str, Any],
                 lineage: str | bool | None = None) -> Path:
    """Write a new version of model `name`; returns its folder.

    `lineage`: a lineage store path, None for the default store ($SCALELAB_LINEAGE or
    ./.scalelab/lineage.db), or False to skip registering.
    """
    root = Path(repo)
    root.mkdir(parents=True, exist_ok=True)
    mdir = repository.model_dir(root, name)
    mdir.mkdir(parents=True, exist_ok=True)
    cfg_path = mdir / repository.CONFIG_FILE
    if not cfg_path.exists():
        repository.write_json(cfg_path, serving_config(name))
    version = repository.next_version(root, name)
    final = repository.version_dir(root, name, version)
    tmp = mdir / f".{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    registry.save_module(tmp, net, arch=ARCH, params=net_config.to_dict(),
                         extra={"classes": list(CLASSES)})
    preprocess.write(tmp)
    digest, files = dir_digest(tmp)
    manifest = Manifest(
        kind="model", name=f"{name}/{version}", digest=digest,
        files={k: file_entry(v) for k, v in files.items()},
        inputs=[{"path": s.path, "digest": s.digest, "kind": s.role} for s in sources],
        parameters=params,
        extras={"architecture": ARCH, "metrics": metrics, "training": training},
    )
    repository.write_json(tmp / repository.MANIFEST_FILE, manifest.to_dict())
    tmp.rename(final)
    if lineage is not False:
        node = register_lineage(final, sources, lineage if isinstance(lineage, str) else None)
        manifest.extras["lineage_node"] = node
        repository.write_json(final / repository.MANIFEST_FILE, manifest.to_dict())
    return final
