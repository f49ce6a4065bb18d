"""The training loop in-process (no process group): batch policy, accumulation, LR schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.loop import train
from scalelab.system.train.rank import Rank
from scalelab.system.train.schedule import default_warmup

from .test_checkpoint import CARDS, _data


def _train(tmp: Path, **kw: object) -> dict[str, object]:
    cfg = TabularRunConfig(max_steps=8, hidden=[8], seed=1, **kw)  # type: ignore[arg-type]
    report, _, _ = train(cfg, _data(), CARDS, Rank(), run_dir=tmp)
    return report


def test_accumulation_matches_one_big_batch(tmp_path: Path) -> None:
    whole = _train(tmp_path, batch=128, base_batch=128)
    micro = _train(tmp_path, batch=128, base_batch=128, accumulation=4)
    assert micro["local_batch"] == 128 and micro["accumulation"] == 4
    for (s1, a), (s2, b) in zip(whole["losses"], micro["losses"], strict=True):  # type: ignore[call-overload]
        assert s1 == s2 and a == pytest.approx(b, abs=1e-5)


def test_linear_lr_scaling_and_default_warmup(tmp_path: Path) -> None:
    r = _train(tmp_path, batch=256, base_batch=64, lr=1e-3)
    assert r["peak_lr"] == pytest.approx(4e-3)
    assert r["warmup_steps"] == 1  # 5% of 8 steps, at least one
    assert default_warmup(None, batch=64, base_batch=64, total_steps=1000) == 0
    assert default_warmup(None, batch=128, base_batch=64, total_steps=1000) == 50
    assert default_warmup(7, batch=128, base_batch=64, total_steps=1000) == 7


def test_strong_and_weak_batches() -> None:
    strong = TabularRunConfig(batch=512, mode="strong")
    weak = TabularRunConfig(batch=512, mode="weak")
    assert (strong.global_batch(4), strong.local_batch(4)) == (512, 128)
    assert (weak.global_batch(4), weak.local_batch(4)) == (2048, 512)
    with pytest.raises(BadUsageError, match="split evenly"):
        TabularRunConfig(batch=6).local_batch(4)
    with pytest.raises(BadUsageError, match="micro-batches"):
        TabularRunConfig(batch=8, accumulation=3).local_batch(2)


def test_run_key_ignores_how_long_and_how_saved() -> None:
    a = TabularRunConfig(max_steps=10, checkpoint_every=5)
    assert a.run_key(2) == TabularRunConfig(max_steps=99, keep=1).run_key(2)
    assert a.run_key(2) != a.run_key(4)
    assert a.run_key(2) != TabularRunConfig(lr=1.0).run_key(2)


def test_peak_rss_is_this_processs_own_not_its_parents() -> None:
    # ru_maxrss survives fork and exec: a child of a 300 MiB parent reports 300 MiB there
    import subprocess
    import sys

    big = bytearray(300 * 2**20)
    big[::4096] = b"\x01" * len(big[::4096])
    code = ("import resource; from scalelab.system.train.metrics import peak_rss_bytes; "
            "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    own, inherited = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True,
                                             text=True, check=True).stdout.split())
    assert inherited >= 300 * 2**20 > own > 0
    del big


def test_rank_0_leaves_its_last_step_for_the_launchers_progress(tmp_path: Path) -> None:
    from scalelab.system.train.rundir import read_progress

    r = _train(tmp_path, batch=64, base_batch=64)
    last_step, last_loss = r["losses"][-1]  # type: ignore[index]
    assert read_progress(tmp_path) == {"step": 8, "total": 8, "loss": last_loss}
    assert last_step == 7
    assert read_progress(tmp_path / "nowhere") is None
