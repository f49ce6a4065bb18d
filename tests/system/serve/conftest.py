"""Fixtures: one model repository and one server process shared by a test module."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the helper modules beside this file, importable whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).parent))

from serve_fixtures import Evil, Server, add_model, start_server


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "flights", {1: 1, 2: 2})
    add_model(root, "routed", {1: 1, 2: 2})
    # one row costs 40 ms serially: queues and deadlines become easy to provoke
    add_model(root, "slow", {1: 3}, arch="delay_mlp", extra_params={"batch_ms": 40, "row_ms": 0},
              max_batch_size=1, dynamic_batching={"max_queue_size": 8, "max_queue_delay_ms": 1,
                                                  "default_timeout_ms": 5000})
    add_model(root, "poison", {1: 4}, arch="poison_mlp",
              extra_params={"poison_value": -999.0},
              dynamic_batching={"max_queue_delay_ms": 50})
    add_model(root, "cached", {1: 5}, cache={"enabled": True, "max_entries": 100, "ttl_s": 60})
    add_model(root, "batchy", {1: 6}, arch="delay_mlp", extra_params={"batch_ms": 20},
              dynamic_batching={"max_queue_delay_ms": 5})
    # a pickle payload where the weights should be: loading must fail without unpickling
    add_model(root, "broken", {1: 7})
    evil = pickle.dumps(Evil(str(root.parent / "PWNED")))
    (root / "broken" / "1" / "model.safetensors").write_bytes(evil)
    (root / "broken" / "1" / "model.pt").write_bytes(evil)
    # a model directory that is a symlink out of the repository
    outside = tmp_path_factory.mktemp("outside")
    add_model(outside, "escape", {1: 8})
    (root / "escape").symlink_to(outside / "escape", target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logdir = tmp_path_factory.mktemp("log")
    srv = start_server(repo, logdir / "server.log", "--admin-token", "s3cret",
                       "--sample-dir", str(logdir / "samples"), "--max-body", "64KiB")
    yield srv
    srv.stop()
