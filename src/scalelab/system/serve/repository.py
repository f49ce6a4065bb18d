"""The live model repository: which models and versions are loaded, their workers, routing state
and caches; load / unload / reload; and the watcher that applies serving.json changes.

Weights come only through nets.registry.load_module (safetensors; nothing is unpickled, so a
pickle payload anywhere in a version directory is never executed). Names and versions go through
nets.repository's checks, and every path is resolved inside the repository root. A model that
fails to load is listed as UNAVAILABLE with the reason; the others keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import ScalelabError
from scalelab.layers.nets import feature_version, registry
from scalelab.layers.nets.model_config import TOKENIZER_FILE, ModelConfig, load_model_config
from scalelab.layers.nets.onnx import INSTALL_HINT as ONNX_HINT
from scalelab.layers.nets.onnx import OnnxNet
from scalelab.layers.nets.onnx import available as onnx_available
from scalelab.layers.nets.repository import (
    CONFIG_FILE,
    check_model_name,
    check_version,
    inside,
    model_dir,
    version_dir,
    versions,
)
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve import faults  # noqa: F401  (registers the fault-injection architectures)
from scalelab.system.serve.cache import Coalescer, TtlLru
from scalelab.system.serve.canary import ROUTING_FILE, Routing, choose, read_routing
from scalelab.system.serve.features import load_preprocess
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.request_sample import RequestSampler
from scalelab.system.serve.runtimes import (
    TRACE_SAFE,
    Outputs,
    check_outputs,
    to_onnx_runtime,
    to_torchscript,
)
from scalelab.system.serve.text import TextEncoder
from scalelab.system.serve.worker import VersionWorker

log = logging.getLogger("scalelab.system.serve")


@dataclass(kw_only=True)
class VersionState:
    version: int
    state: str
    """READY or UNAVAILABLE."""
    reason: str = ""
    worker: VersionWorker | None = None


@dataclass(kw_only=True)
class ModelEntry:
    """Everything the server holds for one model."""

    name: str
    config: ModelConfig | None = None
    versions: dict[int, VersionState] = field(default_factory=dict)
    routing: Routing = field(default_factory=Routing)
    routing_mtime: float | None = None
    reason: str = ""
    cache: TtlLru[Outputs] | None = None
    coalescer: Coalescer[Outputs] = field(default_factory=Coalescer)
    shadow_compared: int = 0
    shadow_disagreed: int = 0

    def ready(self) -> list[int]:
        return sorted(v for v, s in self.versions.items() if s.state == "READY")


def _mtime(p: Path) -> float | None:
    try:
        return p.stat().st_mtime_ns / 1e9
    except FileNotFoundError:
        return None


class ModelRepository:
    def __init__(self, root: Path, *, metrics: Metrics, sampler: RequestSampler | None,
                 poll_s: float = 0.5, drain_s: float = 30.0) -> None:
        if not root.is_dir():
            raise ScalelabError(f"model repository {root} is not a directory; create it or "
                                "pass --model-repo")
        self.root = root.resolve()
        self.metrics = metrics
        self.sampler = sampler
        self.poll_s = poll_s
        self.drain_s = drain_s
        self.models: dict[str, ModelEntry] = {}
        self._lock = asyncio.Lock()

    # -- discovery and loading -----------------------------------------------------------------

    def on_disk(self) -> list[str]:
        names = []
        for p in sorted(self.root.iterdir()):
            if p.is_dir() and (p / CONFIG_FILE).is_file():
                try:
                    check_model_name(p.name)
                    inside(self.root, p)
                except ScalelabError:
                    continue
                names.append(p.name)
        return names

    async def load_all(self) -> None:
        for name in self.on_disk():
            await self.load(name)

    async def load(self, name: str) -> ModelEntry:
        """(Re)load a model: re-read config.json and serving.json, load the versions they want
        afresh, then swap them in and drain the old workers (so a reload never drops requests)."""
        try:
            mdir = model_dir(self.root, name)
        except ScalelabError as e:
            raise HttpError(400, str(e)) from None
        if not (mdir / CONFIG_FILE).is_file():
            raise HttpError(404, f"model '{name}' has no {CONFIG_FILE} in the repository")
        async with self._lock:
            entry = ModelEntry(name=name)
            try:
                cfg = load_model_config(mdir)
                check_outputs(cfg)
                entry.routing = read_routing(self.root, name)
                entry.routing_mtime = _mtime(mdir / ROUTING_FILE)
            except (ScalelabError, ValueError) as e:
                entry.reason = str(e)
                log.error("model %s not loaded: %s", name, e)
                old = self.models.get(name)
                self.models[name] = entry
                if old is not None:
                    await self._stop(old)
                return entry
            entry.config = cfg
            if cfg.cache.enabled:
                entry.cache = TtlLru(max_entries=cfg.cache.max_entries, ttl_s=cfg.cache.ttl_s)
            wanted = set(cfg.version_policy.select(versions(self.root, name)))
            wanted |= entry.routing.versions() & set(versions(self.root, name))
            for v in sorted(wanted):
                entry.versions[v] = await self._load_version(name, v, cfg)
            if not wanted:
                entry.reason = "no version directory matches the version policy"
            old = self.models.get(name)
            self.models[name] = entry
            if old is not None:
                await self._stop(old)
            log.info("model %s loaded: ready versions %s", name, entry.ready())
            return entry

    async def _load_version(self, name: str, v: int, cfg: ModelConfig) -> VersionState:
        try:
            vdir = version_dir(self.root, name, v)
            mismatch = feature_version.mismatch(vdir)  # a model never meets other features
            if mismatch is not None:
                raise ScalelabError(mismatch)
            module = await asyncio.to_thread(registry.load_module, vdir)
            arch = registry.read_spec(vdir)["architecture"]
            module = await self._runtime(module, arch, cfg, f"model {name} version {v}")
            if not isinstance(module, OnnxNet) and (
                    cfg.trace or (cfg.trace is None and arch in TRACE_SAFE)):
                module = await asyncio.to_thread(to_torchscript, module, cfg)
            pre = load_preprocess(vdir)
            text = None if cfg.tokenizer is None else await asyncio.to_thread(
                TextEncoder, vdir / TOKENIZER_FILE, cfg.tokenizer.max_tokens)
        except Exception as e:  # any failure marks this version unavailable, never the server
            log.error("model %s version %d not loaded: %s", name, v, e)
            return VersionState(version=v, state="UNAVAILABLE", reason=str(e))
        worker = VersionWorker(model=name, version=v, module=module, cfg=cfg, pre=pre,
                               metrics=self.metrics, sampler=self.sampler, text=text)
        worker.start()
        return VersionState(version=v, state="READY", worker=worker)

    @staticmethod
    async def _runtime(module: Any, arch: str, cfg: ModelConfig, what: str) -> Any:
        """The network as ONNX Runtime runs it where config.json's `runtime` asks for that
        (auto: trace-safe architectures, when onnx and onnxruntime are installed and the
        export agrees with torch), else `module` unchanged. ScalelabError when `runtime` is
        onnxruntime and the export cannot be used."""
        auto = cfg.runtime == "auto"
        if isinstance(module, OnnxNet) or cfg.runtime == "torch" or (
                auto and arch not in TRACE_SAFE):
            return module
        if not onnx_available():
            if auto:
                return module
            raise ScalelabError(f"config.json asks for runtime onnxruntime, but onnx and "
                                f"onnxruntime are not both installed; {ONNX_HINT}")
        try:
            net = await asyncio.to_thread(to_onnx_runtime, module, cfg)
        except ValueError as e:
            if not auto:
                raise ScalelabError(f"runtime onnxruntime: {e}; set \"runtime\": \"torch\" "
                                    "in config.json to serve it with torch") from None
            log.warning("%s: served by torch, not ONNX Runtime: %s", what, e)
            return module
        log.info("%s: served by ONNX Runtime (exported from %s, agrees with torch)", what, arch)
        return net

    async def _stop(self, entry: ModelEntry) -> None:
        await asyncio.gather(*(s.worker.stop(drain_s=self.drain_s)
                               for s in entry.versions.values() if s.worker is not None))

    async def unload(self, name: str) -> None:
        entry = self.entry(name)
        async with self._lock:
            self.models.pop(name, None)
        await self._stop(entry)

    async def close(self) -> None:
        for name in list(self.models):
            await self.unload(name)

    # -- lookup and routing --------------------------------------------------------------------

    def entry(self, name: str) -> ModelEntry:
        found = self.models.get(name)
        if found is not None:  # every loaded name passed check_model_name in load()
            return found
        try:
            check_model_name(name)
        except ScalelabError as e:
            raise HttpError(400, str(e)) from None
        raise HttpError(404, f"model '{name}' is not loaded; see POST /v2/repository/index")

    @staticmethod
    def _default_state(entry: ModelEntry) -> VersionState:
        """The version an unversioned request goes to before any canary split: routing's
        current one while it is ready, else the newest ready one (503 when none is)."""
        cur = entry.routing.current
        s = entry.versions.get(cur) if cur is not None else None
        if s is not None and s.state == "READY":
            return s
        newest = None  # a loop, not max() over a generator: this runs for every request
        for v, vs in entry.versions.items():
            if vs.state == "READY" and (newest is None or v > newest):
                newest = v
        if newest is None:
            raise HttpError(503, f"model '{entry.name}' has no ready version"
                                  + (f": {entry.reason}" if entry.reason else ""))
        return entry.versions[newest]

    def version_state(self, name: str, version: str | None) -> VersionState:
        entry = self.entry(name)
        if version is None:
            return self._default_state(entry)
        try:
            v = check_version(version)
        except ScalelabError as e:
            raise HttpError(400, str(e)) from None
        s = entry.versions.get(v)
        if s is None:
            raise HttpError(404, f"model '{name}' version {v} is not loaded; loaded: "
                                  f"{sorted(entry.versions)}")
        return s

    def route(self, name: str, version: str | None, request_id: str,
              entry: ModelEntry | None = None) -> VersionWorker:
        """The worker that answers: the asked version, else the canary split over current.
        `entry` is `self.entry(name)` when the caller already holds it."""
        if entry is None:
            entry = self.entry(name)
        if version is None:
            default = self._default_state(entry).version
            chosen = choose(entry.routing, request_id, default)
            s = entry.versions.get(chosen)
            if s is None or s.worker is None:
                s = entry.versions[default]
        else:
            s = self.version_state(name, version)
        if s.worker is None:
            raise HttpError(503, f"model '{name}' version {s.version} is unavailable: {s.reason}")
        return s.worker

    def shadow_worker(self, name: str) -> VersionWorker | None:
        entry = self.models.get(name)
        if entry is None or entry.routing.mode != "shadow" or entry.routing.candidate is None:
            return None
        s = entry.versions.get(entry.routing.candidate)
        return s.worker if s is not None else None

    def index(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name in sorted(set(self.on_disk()) | set(self.models)):
            entry = self.models.get(name)
            if entry is None:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": "unloaded"})
                continue
            if not entry.versions:
                out.append({"name": name, "state": "UNAVAILABLE", "reason": entry.reason})
            for v, s in sorted(entry.versions.items()):
                out.append({"name": name, "version": str(v), "state": s.state,
                            "reason": s.reason})
        return out

    # -- serving.json watcher ------------------------------------------------------------------

    async def refresh_routing(self, name: str) -> bool:
        """Re-read serving.json if it changed; reload when it names versions not loaded."""
        entry = self.models.get(name)
        if entry is None or entry.config is None:
            return False
        path = model_dir(self.root, name) / ROUTING_FILE
        m = _mtime(path)
        if m == entry.routing_mtime:
            return False
        try:
            routing = read_routing(self.root, name)
        except ScalelabError as e:
            log.error("ignoring bad %s: %s", path, e)
            entry.routing_mtime = m
            return False
        if routing.versions() - set(entry.versions):
            await self.load(name)
        else:
            entry.routing, entry.routing_mtime = routing, m
        log.info("model %s routing now %s", name, routing)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            for name in list(self.models):
                with contextlib.suppress(Exception):
                    await self.refresh_routing(name)
