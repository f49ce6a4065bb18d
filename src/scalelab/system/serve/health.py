"""The documents the HTTP and gRPC fronts share: the extensions list and model statistics.

The HTTP handlers are methods of `serve.service.TabularService`; the gRPC ones are in
`serve.grpc_service`.
"""

from __future__ import annotations

from typing import Any

from scalelab.system.serve.repository import ModelRepository

EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics"]
"""The OIP/Triton extensions this server implements (server metadata lists them)."""


def model_stats(repo: ModelRepository, name: str | None, version: str | None
                ) -> dict[str, Any]:
    """The statistics extension's document: every loaded version of `name` (every model's
    when None), or just `version`; web.errors.HttpError 404 for a model or version not loaded."""
    out = []
    for n in ([name] if name is not None else sorted(repo.models)):
        entry = repo.entry(n)
        states = [repo.version_state(n, version)] if version is not None else \
            [entry.versions[v] for v in sorted(entry.versions)]
        out += [s.worker.stats.doc(n, str(s.version)) for s in states if s.worker is not None]
    return {"model_stats": out}
