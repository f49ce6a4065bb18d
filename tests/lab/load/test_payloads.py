import json
from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import ScalelabError
from scalelab.lab.load.http import payloads
from scalelab.lab.load.send import Target, build_request

T = Target.parse("http://127.0.0.1:8000")


def test_build_request_bytes_exactly() -> None:
    t = Target.parse("http://127.0.0.1:8000/x?y=1")
    assert t.path == "/x?y=1" and t.host_header == "127.0.0.1:8000"
    assert build_request(t, method="POST", path="/p", body=b"{}") == (
        b"POST /p HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: scalelab-load\r\n"
        b"Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
    with pytest.raises(ScalelabError):
        Target.parse("ftp://x")


def test_infer_path() -> None:
    assert payloads.infer_path(T, "flights") == "/v2/models/flights/infer"
    assert payloads.infer_path(T, "flights", 3) == "/v2/models/flights/versions/3/infer"
    t = Target.parse("http://h:1/v2/models/m/versions/2/infer")
    assert payloads.infer_path(t, "m") == "/v2/models/m/versions/2/infer"


def test_recorded_requests(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text('{"body": {"a": 1}}\n\n{"method": "get", "path": "/h"}\n')
    specs = payloads.recorded(T, f)
    assert [(s.method, s.path, s.body) for s in specs] == [
        ("POST", "/", b'{"a": 1}'), ("GET", "/h", None)]
    f.write_text('{"bogus": 1}\n')
    with pytest.raises(ScalelabError, match=r"r\.jsonl:1: each line must be one JSON object"):
        payloads.recorded(T, f)
    f.write_text('{"path": "/h"}\n{not json\n[1]\n')
    with pytest.raises(ScalelabError, match=r"r\.jsonl:2: not valid JSON \(line 1, column 2"):
        payloads.recorded(T, f)
    f.write_text('{"path": "/h"}\n[1]\n')
    with pytest.raises(ScalelabError, match=r"r\.jsonl:2: must hold a JSON object, not list; "
                                            "each line must be one JSON object with optional"):
        payloads.recorded(T, f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ScalelabError, match=r"r\.jsonl: not UTF-8 text"):
        payloads.recorded(T, f)


def test_json_body_must_be_json(tmp_path: Path) -> None:
    f = tmp_path / "b.json"
    f.write_text("{not json")
    with pytest.raises(ScalelabError, match="not JSON"):
        payloads.json_body(T, f)


def test_oip_random_follows_the_metadata() -> None:
    meta = {"inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                       {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}]}
    specs = payloads.oip_random(T, "m", meta, batch=3, count=5)
    assert len(specs) == 5 and specs[0].path == "/v2/models/m/infer"
    assert specs[0].body is not None
    body = json.loads(specs[0].body)
    cat, num = body["inputs"]
    assert cat["shape"] == [3, 4] and cat["data"] == [0] * 12
    assert num["shape"] == [3, 14] and len(num["data"]) == 42


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "flights" / "2").mkdir(parents=True)
    (repo / "flights" / "config.json").write_text(json.dumps({"name": "flights", "inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": [-1, 2]},
        {"name": "numeric", "datatype": "FP32", "shape": [-1, 1]}]}))
    (repo / "flights" / "2" / "preprocess.json").write_text(json.dumps({
        "categorical": {"carrier": ["<UNK>", "AA", "UA"], "origin": ["<UNK>", "JFK"]},
        "numeric": {"distance": {"mean": 100.0, "std": 50.0}},
        "classes": ["on_time", "late"]}))
    return repo


def test_flights_sampler_encodes_rows_like_training(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    data = tmp_path / "test.parquet"
    pl.DataFrame({"carrier": ["UA"], "origin": ["LGA"], "distance": [200.0]}).write_parquet(data)
    specs = payloads.flights(T, model="flights", repo=repo, data=data, count=2, batch=2)
    assert specs[0].body is not None
    body = json.loads(specs[0].body)
    assert body["inputs"][0] == {"name": "categorical", "datatype": "INT64", "shape": [2, 2],
                                 "data": [2, 0, 2, 0]}  # UA -> 2, unknown LGA -> 0
    assert body["inputs"][1]["data"] == [2.0, 2.0]  # (200 - 100) / 50
    random = payloads.flights(T, model="flights", repo=repo, count=50)
    for s in random:
        assert s.body is not None
        c = json.loads(s.body)["inputs"][0]["data"]
        assert 0 <= c[0] < 3 and 0 <= c[1] < 2


def test_flights_sampler_needs_a_trained_model(tmp_path: Path) -> None:
    with pytest.raises(ScalelabError, match="no model versions"):
        payloads.flights(T, model="flights", repo=tmp_path)
