"""The hot path's hand check against the full path: the same arrays and wanted outputs for
every request the fast one accepts, and a decline (so the full path names the field) for the
rest."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from serve_fixtures import flights_config, infer_body

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.web.errors import HttpError
from scalelab.system.serve.infer import infer_target, timeout_s
from scalelab.system.serve.protocol import (
    HEADER_LENGTH,
    decode_inputs,
    fast_decode,
    parse_json_fast,
    parse_request,
    wanted,
)

CFG = ModelConfig.model_validate(flights_config("flights"))


def both(body: bytes, header: str | None = None) -> tuple[Any, Any]:
    """(fast result or None, full result or the HttpError it raised)."""
    head, tail = (body, b"") if header is None else (body[:int(header)], body[int(header):])
    fast = fast_decode(parse_json_fast(head), CFG, tail)
    try:
        req, t = parse_request(body, header)
        full: Any = (decode_inputs(req, CFG, t), wanted(req))
    except HttpError as e:
        full = e
    return fast, full


def same(fast: Any, full: Any) -> None:
    assert fast is not None, "the fast path declined a plain request"
    assert not isinstance(full, HttpError), full.message
    for a, b in zip(fast[0], full[0], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert fast[1] == full[1]


def variants() -> list[dict[str, Any]]:
    base = infer_body(3, seed=2, rid="r-1")
    flat = copy.deepcopy(base)
    flat["inputs"][0]["data"] = [x for row in flat["inputs"][0]["data"] for x in row]
    rev = copy.deepcopy(base)
    rev["inputs"] = rev["inputs"][::-1]
    outs = {**copy.deepcopy(base), "outputs": [{"name": "label"},
                                               {"name": "probabilities",
                                                "parameters": {"binary_data": True}}]}
    params = {**copy.deepcopy(base), "parameters": {"binary_data_output": True}, "extra": 1}
    ints = copy.deepcopy(base)
    ints["inputs"][1]["data"] = [1] * 42  # integers are fine for FP32
    return [base, flat, rev, outs, params, ints]


@pytest.mark.parametrize("body", variants())
def test_plain_requests_take_the_fast_path_with_the_same_result(body: dict[str, Any]) -> None:
    same(*both(json.dumps(body).encode()))


def test_binary_inputs_take_the_fast_path() -> None:
    cat = (np.arange(8, dtype=np.int64) % 3).reshape(2, 4)
    num = np.linspace(-1, 1, 28, dtype=np.float32).reshape(2, 14)
    head = json.dumps({"inputs": [
        {"name": "numeric", "datatype": "FP32", "shape": [2, 14],
         "parameters": {"binary_data_size": num.nbytes}},
        {"name": "categorical", "datatype": "INT64", "shape": [2, 4],
         "parameters": {"binary_data_size": cat.nbytes}}]}).encode()
    fast, full = both(head + num.tobytes() + cat.tobytes(), str(len(head)))
    same(fast, full)
    assert np.array_equal(fast[0][0], cat) and np.array_equal(fast[0][1], num)
    # a tail that is short or too long: the fast path declines, the full path names it
    for tail in (num.tobytes(), num.tobytes() + cat.tobytes() + b"x"):
        fast, full = both(head + tail, str(len(head)))
        assert fast is None and isinstance(full, HttpError) and full.status == 400


def mutations() -> list[tuple[str, Any]]:
    def m(f: Any) -> Any:
        return f
    return [
        ("wrong datatype", m(lambda b: b["inputs"][1].update(datatype="INT64"))),
        ("short data", m(lambda b: b["inputs"][1]["data"].pop())),
        ("shape", m(lambda b: b["inputs"][0].update(shape=[1, 5]))),
        ("missing", m(lambda b: b["inputs"].pop())),
        ("unknown", m(lambda b: b["inputs"][0].update(name="cats"))),
        ("strings", m(lambda b: b["inputs"][0].update(data=[["a", "b", "c", "d"]]))),
        ("float in int", m(lambda b: b["inputs"][0].update(data=[[1.5, 1, 1, 1]]))),
        ("no shape", m(lambda b: b["inputs"][0].pop("shape"))),
        ("huge batch", m(lambda b: b["inputs"][0].update(shape=[2**70, 4]))),
        ("batch 65", m(lambda b: b["inputs"][0].update(shape=[65, 4]))),
        ("zero batch", m(lambda b: b["inputs"][0].update(shape=[0, 4]))),
        ("ragged", m(lambda b: b["inputs"][0].update(data=[[1, 2, 3], [1]]))),
        ("data string", m(lambda b: b["inputs"][0].update(data="1,2,3,4"))),
        ("no inputs", m(lambda b: b.pop("inputs"))),
        ("dup input", m(lambda b: b["inputs"].append(copy.deepcopy(b["inputs"][0])))),
        ("id number", m(lambda b: b.update(id=7))),
        ("outputs dict", m(lambda b: b.update(outputs={"name": "label"}))),
        ("output no name", m(lambda b: b.update(outputs=[{"parameters": {}}]))),
        ("params list", m(lambda b: b["inputs"][0].update(parameters=[1]))),
        ("nan", m(lambda b: b["inputs"][1]["data"].__setitem__(0, float("nan")))),
        ("batch disagree", m(lambda b: b["inputs"][1].update(shape=[2, 14],
                                                               data=[0.0] * 28))),
        ("bool dim", m(lambda b: b["inputs"][0].update(shape=[1, True, 4]))),
        ("bools for floats", m(lambda b: b["inputs"][1].update(data=[True] * 14))),
        ("infinity", m(lambda b: b["inputs"][1]["data"].__setitem__(3, float("inf")))),
        ("beyond FP32", m(lambda b: b["inputs"][1]["data"].__setitem__(5, 1e39))),
        ("null value", m(lambda b: b["inputs"][1]["data"].__setitem__(0, None))),
        ("name list", m(lambda b: b["inputs"][0].update(name=["categorical"]))),
        ("name object", m(lambda b: b["inputs"][0].update(name={"x": 1}))),
    ]


@pytest.mark.parametrize(("what", "mutate"), mutations(), ids=[w for w, _ in mutations()])
def test_bad_requests_are_declined_and_the_full_path_names_them(what: str, mutate: Any) -> None:
    body = infer_body(1)
    mutate(body)
    fast, full = both(json.dumps(body).encode())
    assert fast is None, what
    assert isinstance(full, HttpError) and full.status in (400, 422), what


@pytest.mark.parametrize("mutate", [
    lambda b: b["inputs"][0].update(shape=[1.0, 4]),  # pydantic's lax ints
    lambda b: b["inputs"][0].update(shape=["1", 4]),
    lambda b: b["inputs"][0].update(shape=[True, 4]),
])
def test_unusual_but_valid_requests_fall_back_and_succeed(mutate: Any) -> None:
    body = infer_body(1)
    mutate(body)
    fast, full = both(json.dumps(body).encode())
    assert fast is None and not isinstance(full, HttpError)
    assert full[0][0].shape == (1, 4)


def test_values_near_the_fp32_limit() -> None:
    """Up to FP32's largest value both paths accept, with the same array; just past it the
    fast path declines and the full path refuses it (400), neither warning on the cast."""
    body = infer_body(1)
    body["inputs"][1]["data"][0] = 3.4e38
    fast, full = both(json.dumps(body).encode())
    same(fast, full)
    assert full[0][1][0, 0] == np.float32(3.4e38)
    for beyond in (3.5e38, -3.5e38):
        body["inputs"][1]["data"][0] = beyond
        fast, full = both(json.dumps(body).encode())
        assert fast is None and isinstance(full, HttpError) and full.status == 400


def test_large_flat_float_data_is_checked_element_wise() -> None:
    """Beyond a small list the range check is numpy's: the same answers either way."""
    cfg = ModelConfig.model_validate(flights_config("wide", inputs=[
        {"name": "x", "datatype": "FP32", "shape": [-1, 300]}]))
    for bad, ok in ((None, True), (float("inf"), False), (1e39, False), (-1e39, False)):
        data = [0.5] * 300
        if bad is not None:
            data[123] = bad
        raw = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 300], "data": data}]}
        got = fast_decode(parse_json_fast(json.dumps(raw).encode()), cfg, b"")
        assert (got is not None) == ok
        if ok:
            assert got is not None and np.array_equal(got[0][0], np.full((1, 300), 0.5, np.float32))


def test_fp16_inputs_are_range_checked_before_the_cast() -> None:
    """FP16 holds magnitudes up to 65504: values within it are kept (a square-based check
    would overflow at 256), beyond it or NaN the fast path declines."""
    cfg = ModelConfig.model_validate(flights_config("half", inputs=[
        {"name": "x", "datatype": "FP16", "shape": [-1, 3]}]))
    for data, ok in (([300.0, -2000.0, 60000.0], True), ([1.0, 70000.0, 1.0], False),
                     ([1.0, float("nan"), 1.0], False)):
        raw = {"inputs": [{"name": "x", "datatype": "FP16", "shape": [1, 3], "data": data}]}
        got = fast_decode(parse_json_fast(json.dumps(raw).encode()), cfg, b"")
        if ok:
            assert got is not None
            assert np.array_equal(got[0][0], np.array([data], dtype=np.float16))
        else:
            assert got is None


def test_random_requests_agree_with_the_full_path() -> None:
    """Seeded random edits of a valid body (values, types, shapes, names): whatever the fast
    path accepts, the full path accepts with the same arrays; what it declines, the full path
    decides."""
    rng = np.random.default_rng(7)
    pool: list[Any] = [0, 1, -1, 2.5, 1e300, -0.0, True, None, "1", [1], 2**63, 4, 14, 65]
    accepted = declined = 0
    for _ in range(400):
        body = infer_body(int(rng.integers(1, 4)), seed=int(rng.integers(0, 100)))
        for _ in range(int(rng.integers(0, 3))):
            inp = body["inputs"][int(rng.integers(0, 2))]
            where = int(rng.integers(0, 4))
            value = pool[int(rng.integers(0, len(pool)))]
            if where == 0:
                data = inp["data"]
                i = int(rng.integers(0, len(data)))
                if isinstance(data[i], list):
                    data, i = data[i], int(rng.integers(0, len(data[i])))
                data[i] = value
            elif where == 1:
                inp["shape"][int(rng.integers(0, 2))] = value
            elif where == 2:
                inp["datatype"] = ["INT64", "FP32", "FP64", "BOOL"][int(rng.integers(0, 4))]
            elif all(isinstance(r, list) for r in inp["data"]):
                inp["data"] = [x for r in inp["data"] for x in r]  # flat is fine too
        fast, full = both(json.dumps(body).encode())
        if fast is None:
            declined += 1
        else:
            accepted += 1
            same(fast, full)
    assert accepted > 50 and declined > 50  # both sides of the check were exercised


def test_non_dict_and_unparseable_bodies_are_declined() -> None:
    for raw in (b"[1, 2]", b"{not json", b"1", b'"x"', b"null"):
        assert fast_decode(parse_json_fast(raw), CFG, b"") is None


def test_infer_target_matches_only_the_infer_routes() -> None:
    assert infer_target("/v2/models/flights/infer") == ("flights", None)
    assert infer_target("/v2/models/flights/versions/2/infer") == ("flights", "2")
    for path in ("/v2/models/infer", "/v2/models//infer", "/v2/models/a/b/infer",
                 "/v2/models/a/versions//infer", "/v2/models/a/ready", "/v2/models/a/infer/",
                 "/v2/models/a/version/2/infer", "/x/v2/models/a/infer"):
        assert infer_target(path) is None, path


def test_timeout_header() -> None:
    assert timeout_s(None, 1000.0) == 1.0
    assert timeout_s(b"250", 1000.0) == 0.25
    for bad in (b"soon", b"0", b"-5", b"3600001", b"nan"):
        with pytest.raises(HttpError, match="X-Request-Timeout-Ms"):
            timeout_s(bad, 1000.0)
    assert HEADER_LENGTH == "Inference-Header-Content-Length"
