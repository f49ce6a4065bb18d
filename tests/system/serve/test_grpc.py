"""The KServe v2 gRPC endpoint against a real server, with the standard Triton gRPC client: the
same models, queue, batcher, statistics and metrics as the HTTP path."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import ml_dtypes
import numpy as np
import pytest
import torch
from serve_fixtures import Server, add_model, free_port, infer_body, sample_inputs, start_server

from requires import requires
from scalelab.layers.nets.registry import load_module

grpcclient = requires("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

WIDE = {"inputs": [{"name": "categorical", "datatype": "UINT32", "shape": [-1, 4]},
                   {"name": "numeric", "datatype": "BF16", "shape": [-1, 14]}],
        "outputs": [{"name": "probabilities", "datatype": "BF16", "shape": [-1, 4]},
                    {"name": "label", "datatype": "UINT64", "shape": [-1]}]}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "flights", {1: 1})
    add_model(root, "wide", {1: 2}, **WIDE)
    # two rows make a full batch; a lone row waits 5 s for company (Triton's rule)
    add_model(root, "pairs", {1: 3}, max_batch_size=2,
              dynamic_batching={"max_queue_delay_ms": 5000, "dispatch_when_idle": False,
                                "default_timeout_ms": 30000})
    # one row costs 1 s and the queue holds one: the third concurrent request is refused
    add_model(root, "slow", {1: 4}, arch="delay_mlp", extra_params={"batch_ms": 1000, "row_ms": 0},
              max_batch_size=1, dynamic_batching={"max_queue_size": 1, "max_queue_delay_ms": 0,
                                                  "default_timeout_ms": 10000})
    return root


@pytest.fixture(scope="module")
def grpc_server(repo: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[Server, str]]:
    port = free_port()
    srv = start_server(repo, tmp_path_factory.mktemp("log") / "server.log",
                       "--grpc-port", str(port))
    yield srv, f"127.0.0.1:{port}"
    srv.stop()


@pytest.fixture
def client(grpc_server: tuple[Server, str]) -> Iterator[object]:
    c = grpcclient.InferenceServerClient(url=grpc_server[1])
    yield c
    c.close()


def _inputs(cat: np.ndarray, num: np.ndarray) -> list[object]:
    a = grpcclient.InferInput("categorical", list(cat.shape), "INT64")
    a.set_data_from_numpy(cat)
    b = grpcclient.InferInput("numeric", list(num.shape), "FP32")
    b.set_data_from_numpy(num)
    return [a, b]


def _reference(repo: Path, model: str, cat: np.ndarray, num: np.ndarray) -> np.ndarray:
    net = load_module(repo / model / "1")
    with torch.inference_mode():
        return torch.softmax(net(torch.from_numpy(cat.astype(np.int64)),
                                 torch.from_numpy(num)), 1).numpy()


def test_health_and_metadata(client: object) -> None:
    c = client
    assert c.is_server_live() and c.is_server_ready()  # type: ignore[attr-defined]
    meta = c.get_server_metadata()  # type: ignore[attr-defined]
    assert meta.name == "scalelab" and "statistics" in meta.extensions
    assert c.is_model_ready("flights") and c.is_model_ready("flights", "1")  # type: ignore[attr-defined]
    with pytest.raises(grpcclient.InferenceServerException) as e:  # as HTTP's 404
        c.is_model_ready("flights", "7")  # type: ignore[attr-defined]
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "model 'flights' version 7 is not loaded" in e.value.message()
    m = c.get_model_metadata("wide")  # type: ignore[attr-defined]
    assert m.versions == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [
        ("categorical", "UINT32", [-1, 4]), ("numeric", "BF16", [-1, 14])]
    with pytest.raises(grpcclient.InferenceServerException) as e:
        c.get_model_metadata("nope")  # type: ignore[attr-defined]
    assert e.value.status() == "StatusCode.NOT_FOUND" and "model 'nope' is not loaded" in \
        e.value.message()


def test_infer_raw_contents_matches_the_model(client: object, repo: Path) -> None:
    cat, num = sample_inputs(5, seed=21)
    want = _reference(repo, "flights", cat, num)
    res = client.infer("flights", _inputs(cat, num), request_id="g-1")  # type: ignore[attr-defined]
    np.testing.assert_allclose(res.as_numpy("probabilities"), want, rtol=1e-5, atol=1e-6)
    assert res.as_numpy("label").tolist() == want.argmax(1).tolist()
    r = res.get_response()
    assert (r.id, r.model_name, r.model_version) == ("g-1", "flights", "1")
    only = client.infer("flights", _inputs(cat, num), outputs=[  # type: ignore[attr-defined]
        grpcclient.InferRequestedOutput("label")])
    assert [o.name for o in only.get_response().outputs] == ["label"]
    # the new datatypes over gRPC: UINT32 and BF16 in, BF16 and UINT64 out
    a = grpcclient.InferInput("categorical", [5, 4], "UINT32")
    a.set_data_from_numpy(cat.astype(np.uint32))
    b = grpcclient.InferInput("numeric", [5, 14], "BF16")
    b.set_data_from_numpy(num.astype(ml_dtypes.bfloat16))
    res = client.infer("wide", [a, b])  # type: ignore[attr-defined]
    want = _reference(repo, "wide", cat, num.astype(ml_dtypes.bfloat16).astype(np.float32))
    probs = res.as_numpy("probabilities")
    assert probs.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(probs.astype(np.float32), want, rtol=2 ** -8, atol=1e-6)
    assert res.as_numpy("label").dtype == np.uint64
    assert res.as_numpy("label").tolist() == want.argmax(1).tolist()


def test_infer_typed_contents(grpc_server: tuple[Server, str], repo: Path) -> None:
    cat, num = sample_inputs(3, seed=22)
    req = service_pb2.ModelInferRequest(model_name="flights", model_version="1")
    a = req.inputs.add(name="categorical", datatype="INT64", shape=[3, 4])
    a.contents.int64_contents.extend(cat.ravel().tolist())
    b = req.inputs.add(name="numeric", datatype="FP32", shape=[3, 14])
    b.contents.fp32_contents.extend(num.ravel().tolist())
    with grpc.insecure_channel(grpc_server[1]) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        resp = stub.ModelInfer(req, timeout=30)
        names = [o.name for o in resp.outputs]
        probs = np.frombuffer(resp.raw_output_contents[names.index("probabilities")],
                              dtype="<f4").reshape(3, 4)
        np.testing.assert_allclose(probs, _reference(repo, "flights", cat, num), rtol=1e-5,
                                   atol=1e-6)
        # FP16 has no typed field, and a short one is refused naming the input
        bad = service_pb2.ModelInferRequest(model_name="flights")
        bad.CopyFrom(req)
        del bad.inputs[1].contents.fp32_contents[-1]
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(bad, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 'numeric': shape [3, 14] needs 42 values, got 41" in e.value.details()


@pytest.mark.parametrize(("change", "code", "message"), [
    (lambda i: i[1].set_shape([2, 13]), "INVALID_ARGUMENT",
     "input 'numeric': shape [2, 13] does not match the model's [-1, 14]"),
    (lambda i: i.pop(), "INVALID_ARGUMENT", "input 'numeric' is missing"),
])
def test_bad_requests_are_status_codes(client: object, change: object, code: str,
                                       message: str) -> None:
    cat, num = sample_inputs(2, seed=23)
    inputs = _inputs(cat, num)
    change(inputs)  # type: ignore[operator]
    with pytest.raises(grpcclient.InferenceServerException) as e:
        client.infer("flights", inputs)  # type: ignore[attr-defined]
    assert e.value.status() == f"StatusCode.{code}"
    assert message in e.value.message()


def test_grpc_and_http_share_one_batcher(grpc_server: tuple[Server, str], client: object
                                         ) -> None:
    srv, _ = grpc_server
    cat, num = sample_inputs(1, seed=24)
    got: dict[str, object] = {}

    def over_http() -> None:
        got["http"] = httpx.post(f"{srv.url}/v2/models/pairs/infer", json=infer_body(1, 124),
                                 timeout=30).status_code

    t = threading.Thread(target=over_http)
    t.start()
    res = client.infer("pairs", _inputs(cat, num), client_timeout=30)  # type: ignore[attr-defined]
    t.join(30)
    assert got["http"] == 200 and res.as_numpy("label").shape == (1,)
    stats = client.get_inference_statistics("pairs", as_json=True)  # type: ignore[attr-defined]
    s = stats["model_stats"][0]
    # one forward of two rows: a lone request would have waited out the 5 s delay alone
    assert s["execution_count"] == "1" and s["inference_count"] == "2"
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in s["batch_stats"]] == \
        [("2", "1")]


def test_full_queue_is_resource_exhausted(grpc_server: tuple[Server, str]) -> None:
    srv, addr = grpc_server
    errors: list[grpc.RpcError] = []
    ok: list[int] = []

    def one(seed: int) -> None:
        cat, num = sample_inputs(1, seed=seed)  # distinct: identical ones would coalesce
        c = grpcclient.InferenceServerClient(url=addr)
        try:
            c.infer("slow", _inputs(cat, num), client_timeout=30)
            ok.append(1)
        except grpcclient.InferenceServerException as e:
            errors.append(e)  # type: ignore[arg-type]
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert ok and errors, (ok, errors)
    for e in errors:
        assert e.status() == "StatusCode.RESOURCE_EXHAUSTED"  # type: ignore[attr-defined]
        assert "queue full (1 waiting)" in e.message()  # type: ignore[attr-defined]
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert f'scalelab_responses_total{{model="slow",status="429",version="1"}} ' \
           f'{float(len(errors))}' in metrics
    assert f'scalelab_responses_total{{model="slow",status="200",version="1"}} ' \
           f'{float(len(ok))}' in metrics


def test_schema_matches_tritons_published_one() -> None:
    """Every message written out in web.oip_grpc has Triton's field names, numbers, types and
    labels (tritonclient's compiled grpc_service.proto is the reference); only the statistics'
    memory and per-response fields are left out."""
    from scalelab.layers.web.oip_grpc import _POOL, PACKAGE

    ours = _POOL.FindFileByName("scalelab/grpc_predict_v2.proto")
    checked = 0

    def fields(d: object) -> list[tuple[str, int, int, bool, str]]:
        return sorted((f.name, f.number, f.type, f.is_repeated,
                       f.message_type.name if f.message_type else "")
                      for f in d.fields)  # type: ignore[attr-defined]

    left_out = {"inference.ModelStatistics": {"memory_usage", "response_stats"}}

    def walk(mine: object, theirs: object) -> None:
        nonlocal checked
        a, b = set(fields(mine)), set(fields(theirs))
        name = mine.full_name  # type: ignore[attr-defined]
        assert a <= b, (name, a - b)
        assert {f[0] for f in b - a} == left_out.get(name, set()), name
        checked += 1
        for nested in mine.nested_types:  # type: ignore[attr-defined]
            walk(nested, theirs.nested_types_by_name[nested.name])  # type: ignore[attr-defined]

    for name, d in ours.message_types_by_name.items():
        walk(d, service_pb2.DESCRIPTOR.message_types_by_name[name])
    assert checked == 29 and ours.package == PACKAGE == service_pb2.DESCRIPTOR.package


def test_raw_and_typed_contents_are_checked() -> None:
    from scalelab.layers.web.errors import HttpError
    from scalelab.layers.web.oip_grpc import message
    from scalelab.system.serve.grpc_service import http_request

    req = message("ModelInferRequest")(model_name="m")
    req.inputs.add(name="a", datatype="INT64", shape=[1])
    req.inputs.add(name="b", datatype="FP16", shape=[1])
    with pytest.raises(HttpError, match="input 'b': FP16 has no typed contents field; send it "
                                         "in raw_input_contents"):
        http_request(req)
    req.raw_input_contents.append(b"\x00" * 8)
    with pytest.raises(HttpError, match="raw_input_contents has 1 entries for 2 inputs"):
        http_request(req)
    req.raw_input_contents.append(b"\x00" * 2)
    doc, tail = http_request(req)
    assert doc == {"inputs": [
        {"name": "a", "datatype": "INT64", "shape": [1], "parameters": {"binary_data_size": 8}},
        {"name": "b", "datatype": "FP16", "shape": [1], "parameters": {"binary_data_size": 2}}]}
    assert tail == b"\x00" * 10


def test_a_busy_grpc_port_exits_2(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from scalelab.cli import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert run(["serve", "--model-repo", str(repo), "--port", str(free_port()),
                    "--grpc-port", str(port)]) == 2
    assert f"--grpc-port {port}: cannot bind 127.0.0.1:{port}" in capsys.readouterr().err
