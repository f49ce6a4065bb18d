"""How both connections frame an answer's body (load/send.py), on real response heads."""

from __future__ import annotations

import pytest

from scalelab.lab.load.send import CHUNKED, body_framing


@pytest.mark.parametrize(("head", "framing"), [
    (b"http/1.1 200 ok\r\ncontent-type: application/json\r\ncontent-length: 17", 17),
    (b"http/1.1 200 ok\r\ncontent-length: 0\r\nconnection: close", 0),
    (b"http/1.1 200 ok\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream",
     CHUNKED),
    (b"http/1.1 204 no content\r\nserver: x", None),
    (b"http/1.0 200 ok\r\ncontent-type: text/plain", None),
])
def test_body_framing_reads_the_length_or_the_chunking(head: bytes, framing: int | None) -> None:
    assert body_framing(head) == framing
