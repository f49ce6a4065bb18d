"""The admin check of Triton's model repository extension: a bearer token compared in constant
time; no token configured = the endpoints answer 403. The handlers (index, load, unload) are
methods of `serve.service.TabularService`."""

from __future__ import annotations

import hmac

from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.context import ADMIN_TOKEN_ENV


def check_admin(token: str | None, authorization: str) -> None:
    """Raise the 401/403 for this Authorization header, or return when it carries `token`."""
    if token is None:
        raise HttpError(403, "admin endpoints are disabled; start the server with "
                              f"--admin-token or {ADMIN_TOKEN_ENV}")
    if not authorization:
        raise HttpError(401, "admin endpoint: send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer"})
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
        raise HttpError(403, "admin endpoint: the bearer token is not valid")
