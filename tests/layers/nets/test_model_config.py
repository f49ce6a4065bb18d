"""A model's serving config (REPO/<model>/config.json): validation naming the bad field, the
version policy, and the checks on text models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.model_config import ModelConfig, VersionPolicy, load_model_config
from scalelab.layers.nets.repository import write_json


def flights_config(name: str, **over: Any) -> dict[str, Any]:
    """The flights model's config.json, with `over` merged in (dicts key by key)."""
    cfg: dict[str, Any] = {
        "name": name, "platform": "scalelab-torch",
        "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                   {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_ms": 2, "preferred_batch_sizes": [],
                             "max_queue_size": 256, "default_timeout_ms": 1000},
        "version_policy": {"latest": {"num_versions": 2}}}
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


@pytest.mark.parametrize(("policy", "want"), [
    ({"latest": {"num_versions": 2}}, [3, 7]),
    ({"latest": {"num_versions": 9}}, [1, 2, 3, 7]),
    ({"all": {}}, [1, 2, 3, 7]),
    ({"specific": {"versions": [2, 5, 7]}}, [2, 7]),
    ({}, [7]),
])
def test_version_policy(policy: dict[str, object], want: list[int]) -> None:
    assert VersionPolicy.model_validate(policy).select([7, 1, 3, 2]) == want


def test_policy_rejects_two_kinds() -> None:
    with pytest.raises(ValueError, match="give one of"):
        VersionPolicy.model_validate({"all": {}, "latest": {"num_versions": 1}})


def test_defaults_are_bounded_and_delay_not_zero() -> None:
    cfg = ModelConfig.model_validate({k: v for k, v in flights_config("m").items()
                                      if k != "dynamic_batching"})
    assert cfg.dynamic_batching.max_queue_size == 256
    assert cfg.dynamic_batching.max_queue_delay_ms > 0


def test_load_config_names_the_bad_field(tmp_path: Path) -> None:
    d = tmp_path / "m"
    write_json(d / "config.json", flights_config("m", dynamic_batching={"max_queue_size": 0}))
    with pytest.raises(BadInputError, match=r"dynamic_batching\.max_queue_size"):
        load_model_config(d)
    write_json(d / "config.json", flights_config("other"))
    with pytest.raises(BadInputError, match="differs from its directory"):
        load_model_config(d)
    cfg = flights_config("m")
    cfg["inputs"][0]["shape"] = [4, 4]
    write_json(d / "config.json", cfg)
    with pytest.raises(BadInputError, match="batch and must be -1"):
        load_model_config(d)


@pytest.mark.parametrize(("change", "message"), [
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]},
     "inputs ['text'] are BYTES: add \"tokenizer\""),
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 2]}],
      "tokenizer": {"max_tokens": 8}}, "a text input is one string per row"),
    ({"tokenizer": {"max_tokens": 8}}, "a model with a tokenizer takes exactly one input"),
    ({"outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]}]},
     "BYTES outputs are not supported"),
])
def test_text_models_are_checked(change: dict[str, object], message: str) -> None:
    raw: dict[str, object] = {
        "name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}], **change}
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelConfig.model_validate(raw)
    text = ModelConfig.model_validate({
        "name": "m", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}],
        "tokenizer": {"max_tokens": 8}})
    assert [(t.name, t.datatype, t.shape) for t in text.network_inputs()] == [
        ("input_ids", "INT64", [-1, 8]), ("attention_mask", "INT64", [-1, 8])]
