"""Governance for any of the servers: a pure ASGI middleware around the app.

Three servers (tabular, generative, retrieval) share it: each says which requests are work
(`route(scope)` -> the model's name, None for health, metrics and admin) and how its errors
read. For work requests the `Governor` decides before the app runs: refused ones are answered
here (429 + Retry-After naming the limit or budget, 503 for a stopped model, 403 — or 429, per
config — for a stopped client) and never reach the app. Admitted ones run untouched; what the
app reports with `report_usage` (the generative server: tokens) is charged when they end.

The middleware also serves, for every server alike:

- `GET /admin/governance`: the state (limits, burn, in-flight, kill switches, summary);
- `POST /admin/governance/models/NAME/stop` and `.../release`, same for `clients/NAME`: the
  kill switch. Stop refuses new requests at once; requests already admitted finish.
  `?wait_s=S` waits up to S seconds for them to drain and says how many are left;
- `GET /metrics`: the app's own metrics with the governance families appended
  (`scalelab_budget_used`, `scalelab_budget_limit`, `scalelab_governance_refusals_total`,
  `scalelab_governance_stopped`, `scalelab_governance_inflight`, and
  `scalelab_governance_info{summary=...}`, which the serve stage reads into the sheet).

Admin routes need the server's admin token (`Authorization: Bearer TOKEN`): none configured =
403, none sent = 401, a wrong one = 403. No governance configured = no middleware at all
(`governed` returns the app itself): the hot path pays nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scalelab.layers.web.governance.config import GovernanceConfig, load_governance
from scalelab.layers.web.governance.governor import Governor, GovernorCollector
from scalelab.layers.web.guard import REQUEST_ID_HEADER, ErrorBody, accept_request_id, json_error

ADMIN_PREFIX = "/admin/governance"
NONE_CONFIGURED = "none configured"
USAGE_KEY = "governance_usage"
MAX_WAIT_S = 600.0
_RID = REQUEST_ID_HEADER.encode()

Route = Callable[[Scope], str | None]
"""The model a request works for, or None when it is not governed (health, metrics, admin)."""


def report_usage(scope: Scope, unit: str, x: float) -> None:
    """Called by an app: this request used `x` of `unit` (e.g. tokens), charged when it ends.
    A no-op cost when governance is off (one dict write)."""
    state = scope.get("state")
    if state is None:
        scope["state"] = state = {}
    usage = state.get(USAGE_KEY)
    if usage is None:
        state[USAGE_KEY] = usage = {}
    usage[unit] = usage.get(unit, 0.0) + x


def check_bearer(token: str | None, headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """None when the Authorization header carries `token` (compared in constant time), else
    the (status, message) to answer."""
    if not token:
        return 403, ("admin endpoints are disabled; start the server with --admin-token or "
                     "SCALELAB_ADMIN_TOKEN")
    auth = next((v for k, v in headers if k == b"authorization"), b"")
    if not auth:
        return 401, "admin endpoint: send 'Authorization: Bearer <admin token>'"
    scheme, _, given = auth.partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), token.encode()):
        return 403, "admin endpoint: the bearer token is not valid"
    return None


async def _send_json(send: Send, status: int, body: bytes,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class Governance:
    """The middleware (see the module doc)."""

    def __init__(self, app: ASGIApp, governor: Governor, *, route: Route,
                 admin_token: str | None, error_body: ErrorBody = json_error) -> None:
        self.app = app
        self.governor = governor
        self.route = route
        self.admin_token = admin_token
        self.error_body = error_body
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GovernorCollector(governor))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        model = self.route(scope)
        if model is None:
            path = scope["path"]
            if path.startswith(ADMIN_PREFIX):
                await self._admin(scope, receive, send)
            elif path == "/metrics" and scope["method"] == "GET":
                await self._metrics(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        gov = self.governor
        client = gov.identify(scope["headers"])
        refused = gov.admit(client, model)
        if refused is not None:
            rid = accept_request_id(next((v for k, v in scope["headers"] if k == _RID), None))
            headers = [(_RID, rid.encode())]
            if refused.retry_after_s is not None:
                headers.append((b"retry-after", str(refused.retry_after_s).encode()))
            await _send_json(send, refused.status,
                             self.error_body(refused.status, refused.message), headers)
            return
        state = scope.get("state")
        if state is None:
            scope["state"] = state = {}
        try:
            await self.app(scope, receive, send)
        finally:
            gov.release(client, model, state.get(USAGE_KEY))

    # -- /metrics --------------------------------------------------------------------------------

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's exposition with ours appended (the text format allows any number of
        families one after another; the names do not collide)."""
        start: Message | None = None
        parts: list[bytes] = []

        async def capture(msg: Message) -> None:
            nonlocal start
            if msg["type"] == "http.response.start":
                start = msg
            elif msg["type"] == "http.response.body":
                parts.append(msg.get("body", b""))

        await self.app(scope, receive, capture)
        if start is None:
            return
        body = b"".join(parts)
        if start["status"] == 200:
            if body and not body.endswith(b"\n"):
                body += b"\n"
            body += generate_latest(self.registry)
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # -- admin -----------------------------------------------------------------------------------

    async def _admin(self, scope: Scope, receive: Receive, send: Send) -> None:
        bad = check_bearer(self.admin_token, scope["headers"])
        if bad is not None:
            extra = [(b"www-authenticate", b"Bearer")] if bad[0] == 401 else []
            await _send_json(send, bad[0], self.error_body(*bad), extra)
            return
        gov = self.governor
        method = scope["method"]
        rest = scope["path"][len(ADMIN_PREFIX):].strip("/")
        if not rest:
            if method != "GET":
                await self._fail(send, 405, f"{ADMIN_PREFIX}: use GET")
                return
            await _send_json(send, 200, json.dumps(gov.state()).encode())
            return
        parts = rest.split("/")
        if len(parts) != 3 or parts[0] not in ("models", "clients") or \
                parts[2] not in ("stop", "release"):
            await self._fail(send, 404, f"no admin route {scope['path']}; use "
                             f"{ADMIN_PREFIX}/models/NAME/stop|release or "
                             f"{ADMIN_PREFIX}/clients/NAME/stop|release")
            return
        if method != "POST":
            await self._fail(send, 405, f"{scope['path']}: use POST")
            return
        kind, name, action = parts
        try:
            wait_s = self._wait_s(scope)
            if kind == "models" and action == "stop":
                gov.stop_model(name)
            elif kind == "models":
                gov.release_model(name)
            else:
                gov.client(name).stopped = action == "stop"
        except KeyError as e:
            await self._fail(send, 404, str(e.args[0]))
            return
        except ValueError as e:
            await self._fail(send, 400, str(e))
            return
        if action == "stop" and wait_s > 0:
            # polling a counter: the drain is rare and operator-driven, not a hot path
            deadline = time.monotonic() + wait_s
            while gov.inflight_of(kind, name) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        doc = {"kind": kind[:-1], "name": name, "stopped": action == "stop",
               "inflight": gov.inflight_of(kind, name), "summary": gov.summary()}
        await _send_json(send, 200, json.dumps(doc).encode())

    @staticmethod
    def _wait_s(scope: Scope) -> float:
        q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        raw = q.get("wait_s", ["0"])[-1]
        try:
            v = float(raw)
        except ValueError:
            v = -1.0
        if not 0 <= v <= MAX_WAIT_S:
            raise ValueError(f"query wait_s={raw!r} must be seconds in [0, {MAX_WAIT_S:g}]")
        return v

    async def _fail(self, send: Send, status: int, message: str) -> None:
        await _send_json(send, status, self.error_body(status, message))


def governed(app: ASGIApp, config: GovernanceConfig | Path | str | None, *, route: Route,
             admin_token: str | None, error_body: ErrorBody = json_error,
             **clocks: Any) -> ASGIApp:
    """`app` under governance when `config` (a file or a parsed config) is given; the app
    itself, untouched, when it is None."""
    if config is None:
        return app
    cfg = config if isinstance(config, GovernanceConfig) else load_governance(config)
    return Governance(app, Governor(cfg, **clocks), route=route, admin_token=admin_token,
                      error_body=error_body)


def governance_summary(app: object) -> str:
    """The sheet's governance cell for an app built by `governed`."""
    if isinstance(app, Governance):
        return app.governor.summary()
    return NONE_CONFIGURED


def governance_from_metrics(text: str) -> str:
    """The governance cell from a server's /metrics text: the `scalelab_governance_info`
    summary, or "none configured" when the server runs without the middleware (pure)."""
    from scalelab.layers.web.exposition import metric_families

    if "scalelab_governance_info" not in text:
        return NONE_CONFIGURED
    for fam in metric_families(text, "the server's /metrics"):
        if fam.name == "scalelab_governance_info":
            for sample in fam.samples:
                return str(sample.labels.get("summary", NONE_CONFIGURED))
    return NONE_CONFIGURED


def server_governance(base_url: str, timeout_s: float = 5.0) -> str | None:
    """What governance the server at `base_url` enforces now (read from its /metrics, which
    needs no token), or None when /metrics cannot be read."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as r:
            return governance_from_metrics(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
