"""Crash rehearsal for every strategy (a rank SIGKILLed, torchrun restarts the group, it resumes
from the newest distributed checkpoint), a checkpoint written by one strategy resumed by another,
and the two-node rehearsal (one node killed and replaced). All real torchrun runs.

`make test` holds each promise on FSDP over 2 ranks with one shared set of launches (the
module's `fsdp` fixture: the run that loses a rank and the same job uninterrupted, which is
also the reference of the resharding, two-node and single-process checks); the same rehearsals
for every strategy, and at their original sizes, are `slow`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from scalelab.system.train.launch import LaunchConfig
from scalelab.system.train.parallel import ckpt
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.job import Rehearsal, rehearse, run_parallel
from scalelab.system.train.parallel.loop import train
from scalelab.system.train.parallel.multinode import against, lose_a_node, rehearse_node_loss
from scalelab.system.train.rank import Rank
from scalelab.system.train.rundir import final_weights, read_progress
from scalelab.system.train.text import load_corpus

TINY = ParallelConfig.from_flags(
    strategy="dp", layers=2, hidden=32, heads=2, kv_heads=2, ffn=64, seq=32, tokens=20_000,
    batch=4, steps=6, micro_batches=2, profile_steps=0, checkpoint_every=2, threads=1)
FAST = TINY.replace(strategy="fsdp", steps=24, checkpoint_every=3)
"""The fast rehearsals' job. The two-node kill is issued once the step-3 checkpoint is seen
(polled every 50 ms): 20 more steps and 6 checkpoints must not fit in that reaction time, or
the job ends before the kill. A step of this model is milliseconds, so the launches are what
costs, not the steps."""
# Reordered sums (FSDP's reduce-scatter, TP's partial sums) against one process: see
# test_parallel_equivalence.py for why these bounds.
LOSS_TOL, WEIGHT_TOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> Rehearsal:
    """FSDP on 2 ranks with one rank SIGKILLed at a seeded step, torchrun's restart resuming
    it, and the same job uninterrupted (`.reference`)."""
    return rehearse(FAST, LaunchConfig(nproc=2, timeout_s=300, max_restarts=1),
                    tmp_path_factory.mktemp("fsdp"))


def test_fsdp_killed_rank_recovers_bitwise(fsdp: Rehearsal) -> None:
    r = fsdp
    assert r.result.failure is not None and r.result.failure["step"] == r.killed_at_step
    assert r.result.failure["rank"] == r.killed_rank
    # Checkpoints land after every 3rd step: the group resumed from the newest one before the
    # kill, not an older one and not a fresh start (a replay from an older one would also end
    # bitwise equal: the step is what shows which checkpoint was loaded).
    assert FAST.checkpoint.every < r.killed_at_step < FAST.steps
    assert r.resumed_from_step == r.killed_at_step // 3 * 3
    assert r.result.losses == r.reference.losses[r.resumed_from_step:]
    assert r.bitwise_equal and r.max_abs_diff == 0.0
    assert r.losses_equal


def test_fsdp_matches_one_process_and_shards_the_state(fsdp: Rehearsal,
                                                       tmp_path: Path) -> None:
    """DDP/FSDP equivalence, fast form: the uninterrupted FSDP run against the same job in this
    process, the weights and Adam state split over the 2 ranks."""
    single = FAST.replace(strategy="single", checkpoint_every=0)
    c = load_corpus(seq=single.data.seq, max_tokens=single.data.tokens, seed=single.seed)
    report, state = train(single, c.train, Rank(), run_dir=tmp_path)
    assert state is not None
    losses = [v for _, v in report["losses"]]
    ref = fsdp.reference
    assert len(ref.losses) == len(losses) == FAST.steps
    assert max(abs(a - b) for a, b in zip(ref.losses, losses, strict=True)) <= LOSS_TOL
    assert_weights_close(final_weights(Path(ref.run_dir)), state)
    n = sum(int(v.numel()) for v in state.values())
    for rank in ref.ranks:
        assert rank["param_bytes"] <= 4 * n / 2 * 1.05
        assert rank["optimizer_bytes"] == 2 * rank["param_bytes"]


def assert_weights_close(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=WEIGHT_TOL)


def test_fsdp_checkpoint_continues_under_tensor_parallel_fast(fsdp: Rehearsal,
                                                              tmp_path: Path) -> None:
    """DCP reshards: the FSDP run's step-3 checkpoint, alone in a fresh folder, continued by
    TP to the end equals FSDP uninterrupted."""
    src = ckpt.step_dir(Path(fsdp.result.run_dir) / "checkpoints", 3)
    shared = tmp_path / "ckpts"
    shutil.copytree(src, ckpt.step_dir(shared, 3))
    assert ckpt.complete_steps(shared, FAST.run_key(2)) == [3]
    tp = FAST.replace(strategy="tp", checkpoint_dir=str(shared))
    seen: list[tuple[int, int]] = []
    res = run_parallel(tp, LaunchConfig(nproc=2, timeout_s=300), tmp_path / "tp",
                       on_progress=lambda step, total, loss: seen.append((step, total)))
    assert res.resumed_from is not None and res.resumed_from["step"] == 3
    assert len(res.losses) == FAST.steps - 3
    # rank 0's live progress: its last word is the last step (what the launcher polled of it
    # while the run went on came in order, after the resume)
    last = read_progress(tmp_path / "tp")
    assert last is not None and (last["step"], last["total"]) == (FAST.steps, FAST.steps)
    assert seen == sorted(seen) and all(3 < s <= FAST.steps for s, _ in seen)
    ref = fsdp.reference
    assert max(abs(a - b) for a, b in zip(res.losses, ref.losses[3:], strict=True)) <= LOSS_TOL
    assert_weights_close(final_weights(tmp_path / "tp"), final_weights(Path(ref.run_dir)))


def test_two_nodes_one_killed_and_replaced_fast(fsdp: Rehearsal, tmp_path: Path) -> None:
    """Two torchrun agents on 127.0.0.1 (1 FSDP rank each); node B SIGKILLed whole after the
    first checkpoint and replaced: the job ends with the uninterrupted one-node run's weights,
    bit for bit (the fixture's reference: the same job, world and rank → data mapping)."""
    r = against(lose_a_node(FAST, tmp_path, nproc=1, timeout_s=300), fsdp.reference)
    assert r.killed_after_checkpoint >= 3
    assert r.resumed_from_step is not None and r.resumed_from_step >= r.killed_after_checkpoint
    assert r.bitwise_equal and r.max_abs_diff == 0.0
    assert r.result.losses == r.reference.losses[r.resumed_from_step:]
    assert all((tmp_path / f"node-{n}.log").is_file() for n in ("a", "b", "b2"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "pp"])
def test_killed_rank_recovers_bitwise(tmp_path: Path, strategy: str) -> None:
    cfg = TINY.replace(strategy=strategy)
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
    first = TINY.replace(strategy="fsdp", steps=3, checkpoint_dir=str(shared))
    run_parallel(first, LaunchConfig(nproc=2, timeout_s=300), tmp_path / "fsdp")
    assert ckpt.complete_steps(shared, first.run_key(2)) == [2]
    tp = TINY.replace(strategy="tp", checkpoint_dir=str(shared), checkpoint_every=2)
    res = run_parallel(tp, LaunchConfig(nproc=2, timeout_s=300), tmp_path / "tp")
    assert res.resumed_from is not None and res.resumed_from["step"] == 2
    ref = run_parallel(TINY.replace(strategy="fsdp", checkpoint_every=0),
                       LaunchConfig(nproc=2, timeout_s=300), tmp_path / "ref")
    assert max(abs(a - b) for a, b in zip(res.losses, ref.losses[2:], strict=True)) <= 1e-5
    got, want = final_weights(tmp_path / "tp"), final_weights(tmp_path / "ref")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-4)


@pytest.mark.slow
def test_two_nodes_one_killed_and_replaced_ends_with_the_uninterrupted_model(
        tmp_path: Path) -> None:
    cfg = TINY.replace(steps=14, checkpoint_every=3)
    r = rehearse_node_loss(cfg, tmp_path, nproc=1, timeout_s=500)
    assert r.killed_after_checkpoint >= 3
    assert r.resumed_from_step is not None and r.resumed_from_step >= r.killed_after_checkpoint
    assert r.bitwise_equal and r.max_abs_diff == 0.0
    assert r.result.losses == r.reference.losses[r.resumed_from_step:]
    # Both nodes' logs exist: node B was killed and its replacement joined.
    assert all((tmp_path / f"node-{n}.log").is_file() for n in ("a", "b", "b2"))
