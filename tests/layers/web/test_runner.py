"""Choosing the parser and loop, and the run settings' checks."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web import runner
from scalelab.layers.web.runner import UvicornConfig, protocol_path, resolve_http, resolve_loop


def test_auto_prefers_the_compiled_pieces_and_falls_back(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(runner, "has_module", lambda name: True)
    assert (resolve_http("auto"), resolve_loop("auto")) == ("httptools", "uvloop")
    monkeypatch.setattr(runner, "has_module", lambda name: False)
    assert (resolve_http("auto"), resolve_loop("auto")) == ("h11", "asyncio")
    assert (resolve_http("h11"), resolve_loop("asyncio")) == ("h11", "asyncio")
    with pytest.raises(BadUsageError, match=r"scalelab\[serve\]"):
        resolve_http("httptools")
    with pytest.raises(BadUsageError, match=r"scalelab\[serve\]"):
        resolve_loop("uvloop")


def test_protocols_are_importable_by_their_strings() -> None:
    from uvicorn.importer import import_from_string

    for http in ("h11", "httptools"):
        cls = import_from_string(protocol_path(http))
        assert hasattr(cls, "_arm_read_timer")


def test_bad_settings() -> None:
    with pytest.raises(BadUsageError, match="--http 'spdy'"):
        UvicornConfig(http="spdy")
    with pytest.raises(BadUsageError, match="--port 0"):
        UvicornConfig(port=0)
    with pytest.raises(BadUsageError, match="--read-timeout"):
        UvicornConfig(read_timeout_s=0)
