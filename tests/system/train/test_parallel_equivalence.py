"""Each strategy's loss curve against the single-process run on the same data and seed, with
real gloo process groups under torchrun, and the memory planner against what was measured.

Tolerance: the strategies change the order of floating-point sums (gradient all-reduce,
row-parallel partial sums, micro-batch gradient accumulation), never the math, so losses agree
to |Δ| ≤ 1e-5 (on losses ≈ 5.5, about 2 ulp-scale float32 roundings per step) and weights to
1e-4 after the steps. Only tensor parallel over 2 ranks and the pipeline (1F1B, receives posted
ahead) run in `make test` here; FSDP's fast form shares the launches of the crash rehearsal
(test_parallel_recovery.py::test_fsdp_matches_one_process_and_shards_the_state); the rest are
`slow`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from scalelab.system.train.launch import LaunchConfig
from scalelab.system.train.parallel.bench import peak_rss_error, tracked_bytes
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.job import ParallelResult, run_parallel
from scalelab.system.train.parallel.loop import train
from scalelab.system.train.parallel.pipeline import replay_bubble
from scalelab.system.train.rank import Rank
from scalelab.system.train.rundir import final_weights
from scalelab.system.train.text import load_corpus

TINY = ParallelConfig.from_flags(
    strategy="single", layers=2, hidden=32, heads=2, kv_heads=2, ffn=64, seq=32, tokens=20_000,
    batch=4, steps=3, micro_batches=2, profile_steps=1, threads=1)
LOSS_TOL = 1e-5
WEIGHT_TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, Any]]:
    """The single-process run, in this process (no launch cost)."""
    torch.set_num_threads(1)
    c = load_corpus(seq=TINY.data.seq, max_tokens=TINY.data.tokens, seed=TINY.seed)
    report, state = train(TINY, c.train, Rank(), run_dir=tmp_path_factory.mktemp("single"))
    assert state is not None
    return [v for _, v in report["losses"]], state


def launch(tmp: Path, strategy: str, nproc: int, plan_rss: bool = False,
           **kw: Any) -> ParallelResult:
    cfg = TINY.replace(strategy=strategy, **kw)
    return run_parallel(cfg, LaunchConfig(nproc=nproc, timeout_s=240), tmp, plan_rss=plan_rss)


def assert_matches(res: ParallelResult, tmp: Path,
                   reference: tuple[list[float], dict[str, Any]]) -> None:
    losses, state = reference
    assert len(res.losses) == len(losses) == TINY.steps
    assert max(abs(a - b) for a, b in zip(res.losses, losses, strict=True)) <= LOSS_TOL
    got = final_weights(tmp)
    assert got.keys() == state.keys()
    for k in state:
        torch.testing.assert_close(got[k], state[k], rtol=0, atol=WEIGHT_TOL)


def test_tensor_parallel_matches_single_and_halves_the_weights(
        tmp_path: Path, reference: tuple[list[float], dict[str, Any]]) -> None:
    res = launch(tmp_path, "tp", 2)
    assert_matches(res, tmp_path, reference)
    n = sum(int(v.numel()) for v in reference[1].values())
    norms = (2 * TINY.model.layers + 1) * TINY.model.hidden
    for r in res.ranks:
        # Every matrix split in two (the vocabulary's odd row lands on one rank), norms whole.
        assert abs(r["param_bytes"] - 4 * ((n - norms) / 2 + norms)) <= 4 * TINY.model.hidden
        assert r["optimizer_bytes"] == 2 * r["param_bytes"]
        assert r["comm"]["all_reduce"]["calls"] > 0 and r["comm"]["all_reduce"]["bytes"] > 0
    # The planner against the measured parameters + gradients + optimizer + activations.
    assert res.plan is not None
    measured = max(tracked_bytes(r) for r in res.ranks)
    assert abs(res.plan["total_bytes"] - measured) / measured <= 0.15


def assert_schedule_bubble_is_theory(res: ParallelResult, p: int, m: int) -> None:
    """Every step's chunk order, as each stage ran it, replayed with equal stages (F 1 s, B
    2 s, free transfers): the schedule's idle share is exactly the theory (p - 1)/(m + p - 1).
    An order that ran a chunk later than the schedule allows would add idle time."""
    steps = [r["pipeline"]["chunks_by_step"] for r in res.ranks]
    assert steps[0]
    for k in steps[0]:
        orders = [[(kind, int(mb), 1.0 if kind == "F" else 2.0) for kind, mb, *_ in s[k]]
                  for s in steps]
        assert replay_bubble(orders) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


def test_pipeline_with_receives_posted_ahead_matches_single(
        tmp_path: Path, reference: tuple[list[float], dict[str, Any]]) -> None:
    # 1F1B over 4 micro-batches: each stage has up to 4 receives from its peer outstanding at
    # once (pipeline.RecvAhead), matched in the order posted; a mismatch would feed a stage the
    # wrong micro-batch's activations or gradients and move the losses.
    res = launch(tmp_path, "pp", 2, schedule="1f1b", micro_batches=4)
    assert_matches(res, tmp_path, reference)
    # 1F1B's order on 2 stages: stage 0 warms up with p - 1 = 1 forward, then alternates, then
    # drains; stage 1 alternates from the start
    one_f_one_b = [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]]
    for stage, r in enumerate(res.ranks):
        assert r["pipeline"]["recv_ahead"] is True
        for ops in r["pipeline"]["chunks_by_step"].values():
            assert [(k, mb) for k, mb, *_ in ops] == one_f_one_b[stage]
    assert_schedule_bubble_is_theory(res, 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nproc, kw", [
    ("dp", 2, {}),
    ("fsdp", 2, {}),
    ("pp", 2, {"schedule": "gpipe"}),
    ("pp", 2, {"schedule": "1f1b"}),
    ("pp", 2, {"schedule": "gpipe", "recv_ahead": False}),
    ("fsdp+tp", 4, {"tp": 2, "batch": 4}),
])
def test_strategy_matches_single(tmp_path: Path, reference: tuple[list[float], dict[str, Any]],
                                 strategy: str, nproc: int, kw: dict[str, Any]) -> None:
    res = launch(tmp_path, strategy, nproc, plan_rss=strategy in ("dp", "pp"), **kw)
    assert_matches(res, tmp_path, reference)
    if strategy in ("fsdp", "fsdp+tp"):
        n = sum(int(v.numel()) for v in reference[1].values())
        assert max(r["param_bytes"] for r in res.ranks) <= 4 * n / nproc * 1.05
    if strategy == "pp":
        pipe = res.ranks[0]["pipeline"]
        assert pipe["bubble_theory"] == pytest.approx(1 / 3)
        assert_schedule_bubble_is_theory(res, 2, 2)
        assert res.ranks[0]["comm"]["p2p"]["calls"] > 0
        # Every kept step ran each micro-batch's forward and backward once on every stage.
        for r in res.ranks:
            for ops in r["pipeline"]["chunks_by_step"].values():
                assert sorted((k, mb) for k, mb, *_ in ops) == [("B", 0), ("B", 1), ("F", 0),
                                                                ("F", 1)]
                assert all(cpu >= 0 and wall > 0 for *_, cpu, wall in ops)
    if strategy in ("dp", "pp"):
        # The planned peak RSS (the probe's baseline + data + tensors + buffers) against the
        # busiest rank's VmHWM.
        assert res.plan is not None and res.plan["peak_rss"]["runtime_bytes"] > 0
        err = peak_rss_error(res)
        assert err is not None and abs(err) <= 0.15
    if res.plan is not None:
        measured = max(tracked_bytes(r) for r in res.ranks)
        assert abs(res.plan["total_bytes"] - measured) / measured <= 0.15
