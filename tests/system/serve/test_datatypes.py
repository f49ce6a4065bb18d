"""The OIP datatypes beyond the flights model's (UINT16/32/64, BF16, BYTES) on the wire and into
a real model, with the standard Triton HTTP client, and the statistics extension."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
import torch
from serve_fixtures import Server, add_model, sample_inputs, start_server

from requires import requires
from scalelab.layers.nets.registry import load_module
from scalelab.system.serve.tensors import (
    TensorError,
    bf16_bytes,
    bytes_blob,
    bytes_elements,
    from_binary,
    from_values,
    round_bf16,
)

httpclient = requires("tritonclient.http")

WIDE: dict[str, Any] = {
    "inputs": [{"name": "categorical", "datatype": "UINT32", "shape": [-1, 4]},
               {"name": "numeric", "datatype": "BF16", "shape": [-1, 14]}],
    "outputs": [{"name": "probabilities", "datatype": "BF16", "shape": [-1, 4]},
                {"name": "label", "datatype": "UINT64", "shape": [-1]}]}
NARROW: dict[str, Any] = {
    "inputs": [{"name": "categorical", "datatype": "UINT16", "shape": [-1, 4]},
               {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
    "outputs": [{"name": "label", "datatype": "UINT32", "shape": [-1]}]}
BIG: dict[str, Any] = {
    "inputs": [{"name": "categorical", "datatype": "UINT64", "shape": [-1, 4]},
               {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}]}


# -- the conversions, exactly -------------------------------------------------------------------

def test_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    ulp = 2.0 ** -7  # bfloat16 keeps 7 fraction bits
    x = np.array([one, one + ulp / 2, one + 3 * ulp / 2, one + ulp / 4, -2.5, 0.0],
                 dtype=np.float32)
    got = round_bf16(x)
    assert got.tolist() == [one, one, one + 2 * ulp, one, -2.5, 0.0]
    assert bf16_bytes(np.array([1.0, -2.0], dtype=np.float32)) == b"\x80\x3f\x00\xc0"
    back = from_binary(b"\x80\x3f\x00\xc0", "BF16", 2)
    assert back.dtype == np.float32 and back.tolist() == [1.0, -2.0]
    want = np.array([1.0, 1.00390625, 3.0e38], dtype=ml_dtypes.bfloat16)  # the clients' type
    assert bf16_bytes(want.astype(np.float32)) == want.tobytes()


def test_bytes_elements_are_length_prefixed() -> None:
    arr = np.array([b"ab", b"", "\u00e9".encode()], dtype=object)
    blob = bytes_blob(arr)
    assert blob == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xa9"
    got, end = bytes_elements(blob, 3)
    assert got.tolist() == [b"ab", b"", b"\xc3\xa9"] and end == len(blob)
    with pytest.raises(TensorError, match="element 1 says 9 bytes but only 0 remain"):
        bytes_elements(b"\x01\x00\x00\x00a" + struct.pack("<I", 9), 2)
    with pytest.raises(TensorError, match="binary_data_size must be"):
        from_binary(blob + b"xx", "BYTES", 3, size=len(blob) + 2)


def test_values_are_range_checked() -> None:
    assert from_values([[1, 2], [3, 65535]], "UINT16", [2, 2]).dtype == np.uint16
    with pytest.raises(TensorError, match=r"-1 lies outside UINT32's range \[0, 4294967295\]"):
        from_values([1, -1], "UINT32", [2])
    with pytest.raises(TensorError, match="300 lies outside INT8"):
        from_values([300], "INT8", [1])
    assert from_values([2 ** 64 - 1], "UINT64", [1]).tolist() == [2 ** 64 - 1]
    with pytest.raises(TensorError, match="beyond 64 bits"):
        from_values([2 ** 64], "UINT64", [1])
    assert from_values([1.00390625], "BF16", [1]).tolist() == [1.0]  # rounded to bfloat16
    with pytest.raises(TensorError, match="finite"):
        from_values([3.4e38], "BF16", [1])  # rounds past bfloat16's largest value
    with pytest.raises(TensorError, match="BYTES element 1 is int"):
        from_values(["a", 1], "BYTES", [2])


# -- a real server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "wide", {1: 1}, **WIDE)
    add_model(root, "narrow", {1: 1}, **NARROW)
    add_model(root, "big", {1: 1}, **BIG)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(repo, tmp_path_factory.mktemp("log") / "server.log")
    yield srv
    srv.stop()


def _reference(repo: Path, cat: np.ndarray, num: np.ndarray) -> np.ndarray:
    net = load_module(repo / "wide" / "1")
    with torch.inference_mode():
        return torch.softmax(net(torch.from_numpy(cat.astype(np.int64)),
                                 torch.from_numpy(num)), 1).numpy()


def test_tritonclient_uint_and_bf16(server: Server, repo: Path) -> None:
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        cat, num = sample_inputs(5, seed=3)
        num16 = num.astype(ml_dtypes.bfloat16)
        a = httpclient.InferInput("categorical", [5, 4], "UINT32")
        a.set_data_from_numpy(cat.astype(np.uint32), binary_data=True)
        b = httpclient.InferInput("numeric", [5, 14], "BF16")
        b.set_data_from_numpy(num16, binary_data=True)
        res = client.infer("wide", [a, b])
        probs, label = res.as_numpy("probabilities"), res.as_numpy("label")
        want = _reference(repo, cat, num16.astype(np.float32))
        assert probs.dtype == ml_dtypes.bfloat16 and probs.shape == (5, 4)
        # the server's answer is the reference rounded to bfloat16 (8 significant bits)
        np.testing.assert_allclose(probs.astype(np.float32), want, rtol=2 ** -8, atol=1e-6)
        assert label.dtype == np.uint64 and label.tolist() == want.argmax(1).tolist()
        # UINT32 in JSON, outputs asked for as JSON: BF16 data comes back as numbers
        a.set_data_from_numpy(cat.astype(np.uint32), binary_data=False)
        res = client.infer("wide", [a, b], outputs=[
            httpclient.InferRequestedOutput("probabilities", binary_data=False)])
        data = res.get_response()["outputs"][0]["data"]
        vals = np.asarray(data, dtype=np.float32)  # written as the shortest float32 text
        assert round_bf16(vals).tolist() == vals.tolist()  # already bfloat16 values
        np.testing.assert_allclose(np.reshape(data, (5, 4)), want, rtol=2 ** -8, atol=1e-6)

        a = httpclient.InferInput("categorical", [5, 4], "UINT16")
        a.set_data_from_numpy(cat.astype(np.uint16), binary_data=True)
        c = httpclient.InferInput("numeric", [5, 14], "FP32")
        c.set_data_from_numpy(num, binary_data=True)
        got = client.infer("narrow", [a, c]).as_numpy("label")
        assert got.dtype == np.uint32 and got.shape == (5,)
    finally:
        client.close()


def test_bf16_in_json_is_rounded(server: Server, repo: Path) -> None:
    cat, num = sample_inputs(2, seed=4)
    body = {"inputs": [
        {"name": "categorical", "datatype": "UINT32", "shape": [2, 4], "data": cat.tolist()},
        {"name": "numeric", "datatype": "BF16", "shape": [2, 14], "data": num.tolist()}]}
    r = httpx.post(f"{server.url}/v2/models/wide/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["probabilities"]["datatype"] == "BF16"
    want = _reference(repo, cat, round_bf16(num))
    np.testing.assert_allclose(np.reshape(out["probabilities"]["data"], (2, 4)), want,
                               rtol=2 ** -8, atol=1e-6)
    assert out["label"]["datatype"] == "UINT64"
    assert out["label"]["data"] == want.argmax(1).tolist()


@pytest.mark.parametrize(("model", "inp", "data", "binary", "message"), [
    ("wide", "categorical", [[1, 2, 3, -1]], False,
     "input 'categorical': value -1 lies outside UINT32's range"),
    ("wide", "numeric", [1.0] * 13, False,
     "input 'numeric': shape [1, 14] needs 14 values, got 13"),
    ("wide", "numeric", None, b"\x00" * 26,
     "input 'numeric': binary data of 26 bytes is not 14 x 2 bytes of BF16"),
    ("big", "categorical", None, struct.pack("<4Q", 1, 2, 3, 2 ** 63),
     "UINT64 value 9223372036854775808 exceeds 2^63-1"),
])
def test_malformed_tensors_get_400_naming_the_input(server: Server, model: str, inp: str,
                                                    data: list[float] | None,
                                                    binary: bytes | bool, message: str) -> None:
    cat, num = sample_inputs(1)
    spec = {"wide": WIDE, "big": BIG}[model]["inputs"]
    types = {i["name"]: i["datatype"] for i in spec}
    inputs = [
        {"name": "categorical", "datatype": types["categorical"], "shape": [1, 4],
         "data": cat.tolist()},
        {"name": "numeric", "datatype": types["numeric"], "shape": [1, 14],
         "data": num.tolist()}]
    entry = next(i for i in inputs if i["name"] == inp)
    headers = {}
    tail = b""
    if isinstance(binary, bytes):
        del entry["data"]
        entry["parameters"] = {"binary_data_size": len(binary)}
        inputs.sort(key=lambda i: i["name"] != inp)  # binary tensors first, in order
        tail = binary
    else:
        entry["data"] = data
    head = httpx.Request("POST", "/", json={"inputs": inputs}).content
    if tail:
        headers["Inference-Header-Content-Length"] = str(len(head))
    r = httpx.post(f"{server.url}/v2/models/{model}/infer", content=head + tail,
                   headers=headers)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_statistics_extension(server: Server) -> None:
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        before = client.get_inference_statistics("narrow")["model_stats"][0]
        cat, num = sample_inputs(3, seed=5)
        for rows in (1, 2, 3):
            a = httpclient.InferInput("categorical", [rows, 4], "UINT16")
            a.set_data_from_numpy(cat[:rows].astype(np.uint16))
            b = httpclient.InferInput("numeric", [rows, 14], "FP32")
            b.set_data_from_numpy(num[:rows])
            client.infer("narrow", [a, b])
        bad = cat[:1].astype(np.uint16)
        bad[0, 0] = 99  # beyond carrier's vocabulary: refused after routing (a failure)
        a = httpclient.InferInput("categorical", [1, 4], "UINT16")
        a.set_data_from_numpy(bad)
        b = httpclient.InferInput("numeric", [1, 14], "FP32")
        b.set_data_from_numpy(num[:1])
        with pytest.raises(httpclient.InferenceServerException, match="vocabulary"):
            client.infer("narrow", [a, b])
        stats = client.get_inference_statistics("narrow")["model_stats"]
    finally:
        client.close()
    assert [(s["name"], s["version"]) for s in stats] == [("narrow", "1")]
    s = stats[0]
    inf, bi = s["inference_stats"], before["inference_stats"]
    assert s["inference_count"] - before["inference_count"] == 6
    assert inf["success"]["count"] - bi["success"]["count"] == 3
    assert inf["fail"]["count"] - bi["fail"]["count"] == 1
    assert inf["success"]["ns"] > bi["success"]["ns"]
    executions = s["execution_count"] - before["execution_count"]
    assert 1 <= executions <= 3
    assert sum(b["compute_infer"]["count"] for b in s["batch_stats"]) == s["execution_count"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == \
        s["inference_count"]
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == inf["success"]["count"], k  # one per request computed
    assert s["last_inference"] > 0

    every = httpx.get(f"{server.url}/v2/models/stats").json()["model_stats"]
    assert [m["name"] for m in every] == ["big", "narrow", "wide"]
    one = httpx.get(f"{server.url}/v2/models/narrow/versions/1/stats").json()
    assert one["model_stats"][0]["inference_count"] == s["inference_count"]
    assert httpx.get(f"{server.url}/v2/models/nope/stats").status_code == 404
    assert "statistics" in httpx.get(f"{server.url}/v2").json()["extensions"]
