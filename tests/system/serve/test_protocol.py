"""Tensor decoding and validation, and response encoding (no server)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_fixtures import flights_config, infer_body

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.web import codec
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.protocol import (
    HEADER_LENGTH,
    Wanted,
    _all_json,
    _tables,
    decode_inputs,
    encode_outputs,
    encode_response,
    fast_decode,
    parse_json_fast,
    parse_request,
)

CFG = ModelConfig.model_validate(flights_config("flights"))


def decode(body: dict[str, object], tail: bytes = b"") -> list[np.ndarray]:
    req, t = parse_request(json.dumps(body).encode() + tail,
                           str(len(json.dumps(body).encode())) if tail else None)
    return decode_inputs(req, CFG, t)


def test_json_tensors_decode_in_config_order() -> None:
    body = infer_body(3, seed=1)
    body["inputs"] = body["inputs"][::-1]  # type: ignore[index]
    cat, num = decode(body)
    assert cat.dtype == np.int64 and cat.shape == (3, 4)
    assert num.dtype == np.float32 and num.shape == (3, 14)


def test_binary_extension_round_trips() -> None:
    cat = np.arange(8, dtype=np.int64).reshape(2, 4) % 3
    num = np.linspace(-1, 1, 28, dtype=np.float32).reshape(2, 14)
    head = {"inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": [2, 4],
         "parameters": {"binary_data_size": cat.nbytes}},
        {"name": "numeric", "datatype": "FP32", "shape": [2, 14],
         "parameters": {"binary_data_size": num.nbytes}}]}
    c, n = decode(head, cat.tobytes() + num.tobytes())
    assert (c == cat).all() and (n == num).all()
    with pytest.raises(HttpError, match="binary data ends early"):
        decode(head, cat.tobytes())


@pytest.mark.parametrize(("data", "msg"), [
    ([[1, 2, 3, 4], [1, 2, 3]], "ragged"),
    ([[None, 1, 2, 3]], "are not INT64"),
    ([[True, False, True, False]], "are not INT64"),
    ("1,2,3,4", "must be a (flat or nested) JSON array"),
])
def test_bad_categorical_data(data: object, msg: str) -> None:
    body = infer_body(1)
    body["inputs"][0]["data"] = data  # type: ignore[index]
    with pytest.raises(HttpError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        decode(body)
    assert e.value.status == 400


def test_non_finite_floats_refused_and_batch_mismatch() -> None:
    body = infer_body(2)
    body["inputs"][1]["data"][0] = float("nan")  # type: ignore[index]
    with pytest.raises(HttpError, match="finite"):
        decode(json.loads(json.dumps(body)))
    body = infer_body(2)
    body["inputs"][1].update(shape=[1, 14], data=body["inputs"][1]["data"][:14])  # type: ignore[index]
    with pytest.raises(HttpError, match="disagree on the batch dimension"):
        decode(body)


def test_header_length_checked() -> None:
    with pytest.raises(HttpError, match=HEADER_LENGTH):
        parse_request(b"{}", "abc")
    with pytest.raises(HttpError, match="does not fit"):
        parse_request(b"{}", "99")


def test_response_json_and_binary() -> None:
    outputs = {"probabilities": np.full((2, 4), 0.25, dtype=np.float32),
               "label": np.array([0, 3], dtype=np.int64)}
    req, _ = parse_request(json.dumps(infer_body(2, rid="x")).encode(), None)
    body, headers = encode_response(model="flights", version=2, request_id="x", outputs=outputs,
                                    cfg=CFG, req=req)
    doc = json.loads(body)
    assert headers["content-type"] == "application/json"
    assert doc["outputs"][1] == {"name": "label", "datatype": "INT64", "shape": [2],
                                 "data": [0, 3]}
    breq, _ = parse_request(json.dumps({**infer_body(2), "outputs": [
        {"name": "label", "parameters": {"binary_data": True}}]}).encode(), None)
    body, headers = encode_response(model="flights", version=2, request_id=None,
                                    outputs=outputs, cfg=CFG, req=breq)
    n = int(headers[HEADER_LENGTH])
    head = json.loads(body[:n])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 16
    assert np.frombuffer(body[n:], dtype="<i8").tolist() == [0, 3]


def _plain_want() -> Wanted:
    """What the hot path decodes a request without outputs, parameters or id into."""
    fast = fast_decode(parse_json_fast(json.dumps(infer_body(1)).encode()), CFG, b"")
    assert fast is not None
    return fast[1]


def _document(model: str, version: int, outputs: dict[str, np.ndarray]) -> bytes:
    """The response as one JSON document in the codec (what the joined bytes must equal)."""
    return codec.dumps({"model_name": model, "model_version": str(version), "outputs": [
        {"name": n, "datatype": dt, "shape": list(outputs[n].shape),
         "data": outputs[n].reshape(-1)}
        for n, dt in (("probabilities", "FP32"), ("label", "INT64"))]})


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_a_plain_json_answer_is_the_documents_bytes(rows: int) -> None:
    rng = np.random.default_rng(rows)
    batch = {"probabilities": rng.random((rows + 2, 4)).astype(np.float32),
             "label": rng.integers(0, 4, rows + 2)}
    outputs = {k: v[1:rows + 1] for k, v in batch.items()}  # a job's rows of its batch: views
    body, headers = encode_outputs(model="flights", version=12, wanted=_plain_want(),
                                   outputs=outputs, cfg=CFG)
    assert headers == {"content-type": "application/json"}
    assert body == _document("flights", 12, outputs)
    assert _all_json(_tables(CFG), _tables(CFG).json_plan or (), "flights", 12, outputs) == body
    doc = json.loads(body)
    assert doc["outputs"][0]["shape"] == [rows, 4]
    assert np.array(doc["outputs"][0]["data"], np.float32).tolist() == \
        outputs["probabilities"].reshape(-1).tolist()
    assert doc["outputs"][1]["data"] == outputs["label"].tolist()


def test_outputs_off_their_spec_take_the_document_path() -> None:
    want = _plain_want()
    probs = np.full((2, 4), 0.5)  # float64: converted to the spec's FP32
    label = np.array([1, 2], dtype=np.int64)
    body, _ = encode_outputs(model="flights", version=1, wanted=want,
                             outputs={"probabilities": probs, "label": label}, cfg=CFG)
    assert body == _document("flights", 1, {"probabilities": probs.astype(np.float32),
                                            "label": label})
    wide = np.arange(16, dtype=np.float32).reshape(4, 4)[:, ::2]  # not contiguous, 2 columns
    body, _ = encode_outputs(model="flights", version=1, wanted=want,
                             outputs={"probabilities": wide, "label": label}, cfg=CFG)
    assert json.loads(body)["outputs"][0] == {"name": "probabilities", "datatype": "FP32",
                                              "shape": [4, 2], "data": [0, 2, 4, 6, 8, 10, 12, 14]}
    with pytest.raises(HttpError, match="output 'label' is not an output"):
        encode_outputs(model="flights", version=1, wanted=want,
                       outputs={"probabilities": probs}, cfg=CFG)
