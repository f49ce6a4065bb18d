"""Kubernetes manifests as files: the object-name check and the YAML every `deploy` writes.

The parts build their own objects (the server's Deployment and HPA, a load generator's Dask
cluster, a training job); what they share is how a name is checked, how objects are labelled,
how a container's resources are written and how the objects become files, so they cannot drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadUsageError


def check_name(name: str, *, most: int) -> None:
    """Refuse a `--name` that is not a lowercase DNS label of at most `most` characters (the
    objects' names add suffixes to it, so each part leaves itself room)."""
    label = name.replace("-", "")
    if not (name and label.isalnum() and name.islower() and len(name) <= most
            and name[0].isalpha()):
        raise BadUsageError(f"--name {name!r} must be a lowercase DNS label "
                            f"(letters, digits, '-'; at most {most})")


def app_labels(name: str, component: str | None = None) -> dict[str, str]:
    """The recommended app.kubernetes.io labels of every object a part writes (and its pods'
    selector): the job's name, the component where a job has several, part of scalelab."""
    return {"app.kubernetes.io/name": name,
            **({"app.kubernetes.io/component": component} if component else {}),
            "app.kubernetes.io/part-of": "scalelab"}


def resources(cpu: str, memory: str, *, cpu_limit: bool = False) -> dict[str, Any]:
    """A container's requests and limits. Memory is always limited (the pod is killed, not the
    node); CPU only where `cpu_limit` says so, since a CPU limit throttles a pod even on an idle
    node: a load generator wants exactly its core, a server or trainer may use what is free."""
    return {"requests": {"cpu": cpu, "memory": memory},
            "limits": {**({"cpu": cpu} if cpu_limit else {}), "memory": memory}}


def write_manifests(files: Mapping[str, dict[str, Any] | list[dict[str, Any]]],
                    out: Path) -> list[Path]:
    """Write each file's object (or list of objects, as a multi-document file) under `out`."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, docs in files.items():
        p = out / fname
        # Through JSON: shared sub-objects would otherwise become YAML anchors and aliases.
        plain = json.loads(json.dumps(docs))
        text = (yaml.safe_dump_all(plain, sort_keys=False) if isinstance(plain, list)
                else yaml.safe_dump(plain, sort_keys=False))
        p.write_text(text, encoding="utf-8")
        paths.append(p)
    return paths
