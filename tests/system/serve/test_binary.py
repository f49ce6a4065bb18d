"""Triton's binary tensor data extension over raw HTTP: binary inputs, binary outputs, mixed,
and the errors that name the problem (the tritonclient round trip is in test_tritonclient)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import torch
from serve_fixtures import Server, infer_body, sample_inputs

from scalelab.layers.nets.registry import load_module

HLEN = "Inference-Header-Content-Length"


def binary_request(cat: np.ndarray, num: np.ndarray, outputs: list[dict[str, object]]
                   ) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"id": "bin-1", "inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": list(cat.shape),
         "parameters": {"binary_data_size": cat.nbytes}},
        {"name": "numeric", "datatype": "FP32", "shape": list(num.shape),
         "parameters": {"binary_data_size": num.nbytes}}], "outputs": outputs}).encode()
    tail = cat.astype("<i8").tobytes() + num.astype("<f4").tobytes()
    return head + tail, {HLEN: str(len(head)), "content-type": "application/octet-stream"}


def test_binary_in_binary_and_json_out(server: Server, repo: Path) -> None:
    cat, num = sample_inputs(4, seed=21)
    net = load_module(repo / "flights" / "2")
    with torch.inference_mode():
        want = torch.softmax(net(torch.from_numpy(cat), torch.from_numpy(num)), 1).numpy()
    body, headers = binary_request(cat, num, [
        {"name": "probabilities", "parameters": {"binary_data": True}}, {"name": "label"}])
    r = httpx.post(f"{server.url}/v2/models/flights/infer", content=body, headers=headers,
                   timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers[HLEN])
    head = json.loads(r.content[:n])
    assert head["id"] == "bin-1" and head["model_version"] == "2"
    probs_meta, label_meta = head["outputs"]
    assert probs_meta == {"name": "probabilities", "datatype": "FP32", "shape": [4, 4],
                          "parameters": {"binary_data_size": 64}}
    assert len(r.content) == n + 64  # only the binary output follows the header
    probs = np.frombuffer(r.content[n:], dtype="<f4").reshape(4, 4)
    np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-6)
    assert label_meta["data"] == want.argmax(1).tolist()


def test_all_outputs_binary_by_default_parameter(server: Server) -> None:
    cat, num = sample_inputs(2, seed=22)
    body, headers = binary_request(cat, num, [])
    doc = json.loads(body[:int(headers[HLEN])])
    doc["parameters"] = {"binary_data_output": True}
    del doc["outputs"]
    head = json.dumps(doc).encode()
    body = head + body[int(headers[HLEN]):]
    r = httpx.post(f"{server.url}/v2/models/flights/infer", content=body,
                   headers={HLEN: str(len(head))}, timeout=30)
    assert r.status_code == 200, r.text
    n = int(r.headers[HLEN])
    meta = json.loads(r.content[:n])["outputs"]
    sizes = [o["parameters"]["binary_data_size"] for o in meta]
    assert [o["name"] for o in meta] == ["probabilities", "label"] and sizes == [32, 16]
    assert len(r.content) == n + 48
    labels = np.frombuffer(r.content[n + 32:], dtype="<i8")
    probs = np.frombuffer(r.content[n:n + 32], dtype="<f4").reshape(2, 4)
    assert labels.tolist() == probs.argmax(1).tolist()


def test_binary_errors_name_the_problem(server: Server) -> None:
    url = f"{server.url}/v2/models/flights/infer"
    cat, num = sample_inputs(1, seed=23)
    body, headers = binary_request(cat, num, [])
    n = int(headers[HLEN])
    cases = [
        ({HLEN: "abc"}, body, "is not an integer"),
        ({HLEN: str(len(body) + 1)}, body, "does not fit"),
        ({HLEN: str(n)}, body[:-4], "binary data ends early"),
        ({HLEN: str(n)}, body + b"xx", "2 bytes no input claims"),
    ]
    for hdr, content, needle in cases:
        r = httpx.post(url, content=content, headers=hdr, timeout=30)
        assert r.status_code == 400, (needle, r.text)
        assert needle in r.json()["error"]
    # the JSON form still works beside it on the same route
    assert httpx.post(url, json=infer_body(1), timeout=30).status_code == 200
