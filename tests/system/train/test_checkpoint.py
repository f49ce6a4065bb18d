from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.system.train.checkpoint import (
    MARKER,
    STATE_FILE,
    CheckpointStore,
    rng_state,
    save_file_durably,
    set_rng_state,
)
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import Tensors
from scalelab.system.train.loop import train
from scalelab.system.train.rank import Rank
from scalelab.system.train.saver import Saver

CARDS = [5, 4, 7, 3]


def _data(n: int = 600, seed: int = 0) -> Tensors:
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, c, (n,), generator=g) for c in CARDS], dim=1)
    num = torch.randn(n, 14, generator=g)
    y = (num[:, 0] > 0).long() + 2 * (cat[:, 0] == 1).long()
    return Tensors(train_cat=cat, train_num=num, train_y=y, test_cat=cat[:100].clone(),
                   test_num=num[:100].clone(), test_y=y[:100].clone())


def _commit(store: CheckpointStore, step: int) -> None:
    d = store.begin(step)
    save_file_durably({"step": step, "w": torch.full((3,), float(step))}, d / STATE_FILE)
    save_file_durably({"rng": rng_state()}, d / "rank-0.pt")
    store.commit(step)


def test_commit_verify_prune(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for s in (1, 2, 3):
        _commit(store, s)
    assert store.steps() == [2, 3]
    assert store.latest_good() == (3, [])
    assert store.load(3, STATE_FILE)["step"] == 3


def test_truncated_and_markerless_checkpoints_are_skipped(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5)
    for s in (1, 2, 3):
        _commit(store, s)
    p = store.final_dir(3) / STATE_FILE
    p.write_bytes(p.read_bytes()[:-10])
    (store.final_dir(2) / MARKER).unlink()
    good, skipped = store.latest_good()
    assert good == 1
    assert [s.reason for s in skipped] == [
        f"{STATE_FILE} checksum mismatch (truncated or corrupted)", f"no {MARKER}"]


def test_half_written_tmp_is_never_read_and_is_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    _commit(store, 1)
    d = store.begin(2)
    (d / STATE_FILE).write_bytes(b"partial")
    assert store.latest_good() == (1, [])
    store.clean_tmp()
    assert not d.exists()


def test_rng_roundtrip_is_exact_and_weights_only(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    save_file_durably({"rng": rng_state()}, tmp_path / "r.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_saver_writes_a_complete_checkpoint(tmp_path: Path, asynchronous: bool) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    saver = Saver(store, rank=0, world=1, distributed=False, asynchronous=asynchronous)
    w = torch.ones(4)
    saver.save(5, {STATE_FILE: {"w": w, "step": 5}, "rank-0.pt": {"rng": rng_state()}})
    w.add_(1)  # training moves on; the async snapshot must not see it
    saver.wait()
    assert store.latest_good() == (5, [])
    assert torch.equal(store.load(5, STATE_FILE)["w"], torch.ones(4))
    assert saver.stats.saves == 1 and len(saver.stats.blocking_s) == 1


def _run(tmp: Path, **kw: object) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    cfg = TabularRunConfig(batch=64, base_batch=64, max_steps=10, hidden=[8], seed=4,
                           checkpoint_dir=str(tmp / "ck"), keep=3, **kw)  # type: ignore[arg-type]
    report, _net, state = train(cfg, _data(), CARDS, Rank(), run_dir=tmp)
    assert state is not None
    return report, {k: v.clone() for k, v in state.items()}


@pytest.fixture
def deterministic() -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.usefixtures("deterministic")
def test_resume_skips_a_truncated_checkpoint_and_matches_uninterrupted(tmp_path: Path) -> None:
    _, reference = _run(tmp_path / "ref")
    first, _ = _run(tmp_path / "a", checkpoint_every=3)
    store = CheckpointStore(tmp_path / "a" / "ck", keep=3)
    assert store.steps() == [3, 6, 9]
    state = store.final_dir(9) / STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    resumed, weights = _run(tmp_path / "a", checkpoint_every=3)
    assert resumed["resumed_from"]["step"] == 6  # type: ignore[index]
    assert resumed["skipped"][0]["reason"].startswith(STATE_FILE)  # type: ignore[index]
    assert resumed["steps_run"] == 4
    assert all(torch.equal(weights[k], reference[k]) for k in reference)
    assert resumed["losses"] == first["losses"]


def test_auto_interval_measures_the_save_and_applies_daly(tmp_path: Path) -> None:
    report, _ = _run(tmp_path, checkpoint_auto=True, mtbf_s=1.0)
    ck = report["checkpoint"]
    assert ck["auto"] and ck["save_cost_s"] > 0  # type: ignore[index]
    assert ck["interval_steps"] >= 1  # type: ignore[index]


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path: Path) -> None:
    _run(tmp_path, checkpoint_every=3)
    other, _ = _run(tmp_path, checkpoint_every=3, lr=1e-2)
    assert other["resumed_from"] is None
    assert "other settings" in other["skipped"][0]["reason"]  # type: ignore[index]
