import json
from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import (
    Latency,
    append_records,
    make_record,
    new_experiment_id,
    read_records,
)


def test_round_trip_is_append_only(tmp_path: Path) -> None:
    path = tmp_path / "r" / "records.jsonl"
    a = make_record(
        experiment="e1",
        stage="serve",
        variable="rate",
        level=100,
        repeat=0,
        rate=98.5,
        rate_unit="requests/s",
        latency=Latency(p50_ms=3.0, p95_ms=9.0),
        quality={"f1_macro": 0.5},
        extras={"batching": True},
    )
    b = make_record(experiment="e1", stage="serve", variable="rate", level=200, repeat=1)
    assert append_records(path, [a]) == 1
    assert append_records(path, [b]) == 1
    got = read_records(path)
    assert got == [a, b]
    assert got[0].latency is not None and got[0].latency.p95_ms == 9.0
    assert got[0].machine.cores >= 1


def test_bad_fields_are_rejected_at_construction() -> None:
    with pytest.raises(BadInputError, match="failure_rate"):
        make_record(experiment="e", stage="data", variable="scale", level=1, failure_rate=1.5)
    with pytest.raises(BadInputError, match="stage"):
        make_record(experiment="e", stage="Bad Stage", variable="scale", level=1)


def test_reader_names_the_bad_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    good = make_record(experiment="e", stage="data", variable="scale", level=1)
    append_records(path, [good])
    with path.open("a") as f:
        f.write("{not json\n")
    with pytest.raises(BadInputError, match=r"records.jsonl:2: not valid JSON"):
        read_records(path)

    obj = json.loads(good.model_dump_json())
    obj["repeat"] = -1
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(BadInputError, match=r":1: field 'repeat'"):
        read_records(path)

    obj = json.loads(good.model_dump_json())
    obj["surprise"] = 1
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(BadInputError, match="surprise"):
        read_records(path)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="does not exist"):
        read_records(tmp_path / "nope.jsonl")
    p = tmp_path / "bin.jsonl"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BadInputError, match="UTF-8"):
        read_records(p)


def test_experiment_ids_are_unique_and_prefixed() -> None:
    ids = {new_experiment_id("sweep") for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("sweep-") for i in ids)
