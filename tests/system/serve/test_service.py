"""The tabular server's FastAPI handler methods called directly: no socket, no server, no
TestClient. A real model repository (two versions of a real tabular net) loaded by the real
repository; the admin routes' token check included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from serve_fixtures import add_model

from scalelab import __version__
from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.hook import local_request
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.infer import InferHandler
from scalelab.system.serve.service import TabularService
from scalelab.system.serve.settings import ServerSettings

T = TypeVar("T")
TOKEN = "svc-token"


def with_service(tmp_path: Path, work: Callable[[TabularService], Awaitable[T]]) -> T:
    """`work` on a service whose repository is loaded (and closed afterwards)."""
    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1, 2: 2})
    ctx = ServeContext.build(ServerSettings(model_repo=repo, admin_token=TOKEN))
    svc = TabularService(ctx, InferHandler(ctx))

    async def go() -> T:
        await ctx.repo.load_all()
        ctx.started = True
        try:
            return await work(svc)
        finally:
            await ctx.repo.close()

    return asyncio.run(go())


def doc(resp: Any) -> Any:
    return json.loads(bytes(resp.body))


def test_health_metadata_readiness_routing_and_stats(tmp_path: Path) -> None:
    async def work(svc: TabularService) -> dict[str, Any]:
        return {"live": await svc.live(), "ready": await svc.ready(),
                "server": await svc.server_metadata(),
                "model": await svc.model_metadata("flights"),
                "v1": await svc.version_metadata("flights", "1"),
                "model_ready": await svc.model_ready("flights"),
                "routing": await svc.routing("flights"),
                "stats": await svc.all_stats(),
                "metrics": await svc.prometheus()}

    out = with_service(tmp_path, work)
    assert out["live"] == {"live": True}
    assert (out["ready"].status_code, doc(out["ready"])) == (200, {"ready": True})
    assert out["server"]["version"] == __version__
    assert out["server"]["extensions"] == ["binary_tensor_data", "model_repository",
                                           "statistics"]
    assert out["model"]["versions"] == ["1", "2"] and out["v1"]["versions"] == ["1"]
    assert [i["name"] for i in out["model"]["inputs"]] == ["categorical", "numeric"]
    assert doc(out["model_ready"]) == {"name": "flights", "ready": True}
    assert out["routing"]["ready_versions"] == [1, 2]
    assert out["routing"]["shadow"] == {"compared": 0, "disagreed": 0,
                                        "disagreement_rate": None}
    assert [(s["name"], s["version"]) for s in out["stats"]["model_stats"]] == [
        ("flights", "1"), ("flights", "2")]
    assert out["metrics"].media_type.startswith("text/plain; version=0.0.4")


def test_unknown_models_and_versions_are_named(tmp_path: Path) -> None:
    async def work(svc: TabularService) -> list[HttpError]:
        errors = []
        for call in (lambda: svc.model_metadata("nope"),
                     lambda: svc.version_ready("flights", "9"),
                     lambda: svc.one_model_stats("nope")):
            try:
                await call()
            except HttpError as e:
                errors.append(e)
        return errors

    errors = with_service(tmp_path, work)
    assert [e.status for e in errors] == [404, 404, 404]
    assert "nope" in errors[0].message and "9" in errors[1].message


def test_repository_extension_needs_the_admin_token(tmp_path: Path) -> None:
    async def work(svc: TabularService) -> tuple[list[int], Any]:
        statuses = []
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            try:
                await svc.repo_index(local_request("GET", "/v2/repository/index",
                                                   headers=headers))
            except HttpError as e:
                statuses.append(e.status)
        ok = await svc.repo_index(local_request(
            "GET", "/v2/repository/index", headers={"Authorization": f"Bearer {TOKEN}"}))
        return statuses, doc(ok)

    statuses, index = with_service(tmp_path, work)
    assert statuses == [401, 403]
    assert [(m["name"], m["version"], m["state"]) for m in index] == [
        ("flights", "1", "READY"), ("flights", "2", "READY")]


@pytest.mark.parametrize("version", [None, "2"])
def test_infer_routes_hand_the_exchange_to_the_bare_handler(tmp_path: Path,
                                                           version: str | None) -> None:
    async def work(svc: TabularService) -> Any:
        if version is None:
            return await svc.infer_route("flights")
        return await svc.infer_version_route("flights", version)

    resp = with_service(tmp_path, work)
    assert (resp.handler.__class__, resp.name, resp.version) == (InferHandler, "flights",
                                                                 version)
