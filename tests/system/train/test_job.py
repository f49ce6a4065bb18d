"""End to end with real torchrun processes on CPU (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scalelab.layers.nets import registry
from scalelab.layers.nets.repository import read_json
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import prepare
from scalelab.system.train.job import TrainResult, run_training
from scalelab.system.train.launch import LaunchConfig
from scalelab.system.train.loop import train
from scalelab.system.train.rank import Rank
from scalelab.system.train.summary import RunSummary, summarize

from .conftest import LIMIT

STEPS = 12
LOSS_TOLERANCE = 1e-4
"""1 vs 2 processes at the same global batch: same math, different float summation order."""


def _cfg(**kw: object) -> TabularRunConfig:
    return TabularRunConfig(limit=LIMIT, batch=256, base_batch=256, max_steps=STEPS,
                            hidden=[16, 16], **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("repo")


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> RunSummary:
    """The single-process reference, trained in this process (same loop, no process group)."""
    cfg = _cfg()
    data, pre, _ = prepare(cfg.data, cfg.limit, cfg.seed)
    report, _, _ = train(cfg, data, pre.cardinalities(), Rank(),
                         run_dir=tmp_path_factory.mktemp("one"))
    return summarize(cfg, [report], None)


@pytest.fixture(scope="module")
def two(repo: Path) -> TrainResult:
    return run_training(_cfg(), LaunchConfig(nproc=2, timeout_s=240), repo=str(repo))


def test_two_processes_follow_the_one_process_loss_curve(one: RunSummary,
                                                         two: TrainResult) -> None:
    a, b = one, two.summary
    assert (a.world, b.world) == (1, 2)
    assert a.global_batch == b.global_batch == 256 and b.local_batch == 128
    assert [s for s, _ in a.loss_curve] == [s for s, _ in b.loss_curve] == list(range(STEPS))
    diffs = [abs(x - y) for (_, x), (_, y) in zip(a.loss_curve, b.loss_curve, strict=True)]
    assert max(diffs) < LOSS_TOLERANCE
    assert a.loss_curve[-1][1] < a.loss_curve[0][1]  # it learns
    assert b.backend == "gloo" and b.threads == 1


def test_run_metrics_are_complete(two: TrainResult) -> None:
    s = two.summary
    assert set(s.phase_ms_per_step) == {"data", "forward", "backward", "comm", "optimizer"}
    assert s.phase_ms_per_step["comm"] > 0 and 0 < s.comm_share < 1
    assert s.rate.samples_per_s > 0 and s.rate.flops_per_s is not None
    assert s.flops_per_sample is not None and s.flops_per_sample > 0
    assert len(s.memory) == 2 and all(m.peak_rss_bytes > 0 for m in s.memory)
    ev = two.evaluation
    assert [c.name for c in ev.per_class] == ["on_time", "late_15_60", "late_60_plus",
                                              "cancelled"]
    assert len(ev.reliability) == 10
    # the bins partition the held-out rows, and their accuracies add up to the overall one
    # (the exact math of `scores` is test_evaluate.py's; this checks the trained model's)
    assert sum(b.count for b in ev.reliability) == ev.n == sum(c.support for c in ev.per_class)
    assert sum(b.count * (b.accuracy or 0.0) for b in ev.reliability) / ev.n == \
        pytest.approx(ev.accuracy, abs=1e-12)
    assert ev.ece == pytest.approx(sum(b.count / ev.n * abs(b.confidence - b.accuracy)
                                       for b in ev.reliability if b.count
                                       if b.confidence is not None and b.accuracy is not None),
                                   abs=1e-12)
    # the top-class probability of 4 classes is at least 1/4: the bins below are empty
    assert [b.count for b in ev.reliability[:2]] == [0, 0]


def test_model_is_saved_in_the_serving_layout(two: TrainResult, repo: Path) -> None:
    assert two.model_dir == str(repo / "flights" / "1")
    vdir = Path(two.model_dir)
    assert sorted(p.name for p in vdir.iterdir()) == [
        "manifest.json", "model.json", "model.safetensors", "preprocess.json"]
    config = read_json(repo / "flights" / "config.json")
    assert config["inputs"][0] == {"name": "categorical", "datatype": "INT64", "shape": [-1, 4]}
    assert config["inputs"][1]["shape"] == [-1, 14] and config["max_batch_size"] == 64
    pre = read_json(vdir / "preprocess.json")
    assert pre["classes"] == ["on_time", "late_15_60", "late_60_plus", "cancelled"]
    assert pre["categorical"]["carrier"][0] == "<UNK>" and len(pre["numeric"]) == 14
    manifest = read_json(vdir / "manifest.json")
    assert manifest["kind"] == "model" and len(manifest["digest"]) == 64
    assert {i["kind"] for i in manifest["inputs"]} == {"raw"}
    assert all(len(i["digest"]) == 64 for i in manifest["inputs"])
    assert manifest["extras"]["metrics"]["accuracy"] == pytest.approx(two.evaluation.accuracy)
    assert isinstance(manifest["extras"]["lineage_node"], int)
    net = registry.load_module(vdir)
    assert sum(p.numel() for p in net.parameters()) == two.summary.n_params
    logits = net(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 14))
    assert logits.shape == (3, 4)


def test_sharded_optimizer_state_shrinks_per_rank(two: TrainResult) -> None:
    ddp = [m.optimizer_state_bytes for m in two.summary.memory]
    for shard in ("zero", "fsdp"):
        r = run_training(_cfg(shard=shard), LaunchConfig(nproc=2, timeout_s=240))
        mine = [m.optimizer_state_bytes for m in r.summary.memory]
        assert all(b < 0.75 * d for b, d in zip(mine, ddp, strict=True)), (shard, mine, ddp)
        # Same optimisation, sharded: the curve matches plain DDP.
        assert abs(r.summary.final_loss - two.summary.final_loss) < LOSS_TOLERANCE
