"""Crash rehearsal for every strategy (a rank SIGKILLed, torchrun restarts the group, it resumes
from the newest distributed checkpoint), a checkpoint written by one strategy resumed by another,
and the two-node rehearsal (one node killed and replaced). All real torchrun runs: `slow`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from scalelab.train.launch import LaunchConfig
from scalelab.train.parallel import ckpt
from scalelab.train.parallel.config import ParallelConfig
from scalelab.train.parallel.job import final_weights, rehearse, run_parallel
from scalelab.train.parallel.multinode import rehearse_node_loss

TINY = ParallelConfig(strategy="dp", layers=2, hidden=32, heads=2, kv_heads=2, ffn=64, seq=32,
                      tokens=20_000, batch=4, steps=6, micro_batches=2, profile_steps=0,
                      checkpoint_every=2, threads=1)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "pp"])
def test_killed_rank_recovers_bitwise(tmp_path: Path, strategy: str) -> None:
    cfg = dataclasses.replace(TINY, strategy=strategy)  # type: ignore[arg-type]
    r = rehearse(cfg, LaunchConfig(nproc=2, timeout_s=300, max_restarts=1), tmp_path)
    assert r.result.failure is not None and r.result.failure["step"] == r.killed_at_step
    # The kill comes after the first checkpoint (step 2), so the group resumed from one.
    assert r.resumed_from_step is not None and 2 <= r.resumed_from_step <= r.killed_at_step
    assert r.bitwise_equal and r.max_abs_diff == 0.0
    assert r.losses_equal


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_under_tensor_parallel(tmp_path: Path) -> None:
    """DCP reshards: an FSDP checkpoint at step 2 continued by TP equals FSDP to the end."""
    shared = tmp_path / "ckpts"
    first = dataclasses.replace(TINY, strategy="fsdp", steps=3, checkpoint_dir=str(shared))
    run_parallel(first, LaunchConfig(nproc=2, timeout_s=300), tmp_path / "fsdp")
    assert ckpt.complete_steps(shared, first.run_key(2)) == [2]
    tp = dataclasses.replace(TINY, strategy="tp", checkpoint_dir=str(shared), checkpoint_every=2)
    res = run_parallel(tp, LaunchConfig(nproc=2, timeout_s=300), tmp_path / "tp")
    assert res.resumed_from is not None and res.resumed_from["step"] == 2
    ref = run_parallel(dataclasses.replace(TINY, strategy="fsdp", checkpoint_every=0),
                       LaunchConfig(nproc=2, timeout_s=300), tmp_path / "ref")
    assert max(abs(a - b) for a, b in zip(res.losses, ref.losses[2:], strict=True)) <= 1e-5
    got, want = final_weights(tmp_path / "tp"), final_weights(tmp_path / "ref")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-4)


@pytest.mark.slow
def test_two_nodes_one_killed_and_replaced_ends_with_the_uninterrupted_model(
        tmp_path: Path) -> None:
    cfg = dataclasses.replace(TINY, steps=14, checkpoint_every=3)
    r = rehearse_node_loss(cfg, tmp_path, nproc=1, timeout_s=500)
    assert r.killed_after_checkpoint >= 3
    assert r.resumed_from_step is not None and r.resumed_from_step >= r.killed_after_checkpoint
    assert r.bitwise_equal and r.max_abs_diff == 0.0
    assert r.result.losses == r.reference.losses[r.resumed_from_step:]
    # Both nodes' logs exist: node B was killed and its replacement joined.
    assert all((tmp_path / f"node-{n}.log").is_file() for n in ("a", "b", "b2"))
