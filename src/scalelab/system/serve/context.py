"""What every part of the server shares: settings, the repository, metrics, the access log, the
admin token, lifecycle flags and the background tasks (shadow mirrors) shutdown waits for."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from scalelab.layers.web.access import AccessLog
from scalelab.layers.web.trace import Tracing
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.repository import ModelRepository
from scalelab.system.serve.request_sample import RequestSampleConfig, RequestSampler
from scalelab.system.serve.settings import ServerSettings

ADMIN_TOKEN_ENV = "SCALELAB_ADMIN_TOKEN"


@dataclass(kw_only=True, eq=False)
class ServeContext:
    settings: ServerSettings
    repo: ModelRepository
    metrics: Metrics
    access: AccessLog
    token: str | None
    """Bearer token of the admin endpoints; None = they answer 403."""
    tracing: Tracing | None = None
    """Request tracing; None = off (the handlers test this one field, nothing else)."""
    started: bool = False
    draining: bool = False
    background: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def build(cls, settings: ServerSettings) -> ServeContext:
        metrics = Metrics()
        sampler = None
        if settings.sample_dir is not None:
            # each worker process samples into its own folder (files are not shared)
            sub = settings.sample_dir / f"pid-{os.getpid()}" if settings.workers > 1 \
                else settings.sample_dir
            sampler = RequestSampler(RequestSampleConfig(directory=sub, rate=settings.sample_rate,
                                                    max_rows=settings.sample_max_rows,
                                                    max_files=settings.sample_max_files))
        repo = ModelRepository(settings.model_repo, metrics=metrics, sampler=sampler,
                               poll_s=settings.poll_s, drain_s=settings.graceful_s)
        access = AccessLog("scalelab.system.serve.access", settings.access_log,
                           per_second=settings.access_log_per_second)
        token = settings.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
        return cls(settings=settings, repo=repo, metrics=metrics, access=access, token=token,
                   tracing=Tracing.build(settings.trace, "scalelab-serve"))

    def ready(self) -> bool:
        repo = self.repo
        return self.started and not self.draining and (
            not repo.models or any(e.ready() for e in repo.models.values()))
