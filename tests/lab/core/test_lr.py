"""Linear scaling and gradual warmup (Goyal et al. 2017)."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.lr import LrScaling, lr_at, scaled_lr

PAPER = LrScaling(base_lr=0.1, base_batch=256, batch=8192, warmup_epochs=5)


def test_linear_scaling_rule() -> None:
    assert scaled_lr(0.1, 256, 8192) == 3.2 and PAPER.scaled_lr == 3.2 and PAPER.k == 32.0
    assert scaled_lr(0.1, 256, 128) == 0.05


def test_warmup_per_epoch_from_base_lr_to_scaled() -> None:
    rows = PAPER.epochs()
    assert [r.epoch for r in rows] == [0, 1, 2, 3, 4, 5]
    # 0.1 + 3.1 × e/5: a rise of 0.62 per epoch.
    assert [r.lr for r in rows] == pytest.approx([0.1, 0.72, 1.34, 1.96, 2.58, 3.2], abs=1e-12)
    assert [r.lr for r in PAPER.epochs(7)][5:] == [3.2, 3.2, 3.2]


def test_per_step_formula() -> None:
    spe = 100  # 500 warmup steps
    assert PAPER.lr_at(0, spe) == 0.1
    assert PAPER.lr_at(250, spe) == pytest.approx(1.65, abs=1e-12)
    assert PAPER.lr_at(499, spe) == pytest.approx(0.1 + 3.1 * 499 / 500, abs=1e-12)
    assert PAPER.lr_at(500, spe) == 3.2 and PAPER.lr_at(10_000, spe) == 3.2
    for step in (0, 1, 137, 499, 500, 900):
        assert lr_at(step, base_lr=0.1, base_batch=256, batch=8192, warmup=500) == \
            PAPER.lr_at(step, spe)


def test_epoch_granularity_and_custom_start() -> None:
    s = LrScaling(base_lr=0.1, base_batch=256, batch=8192, warmup_epochs=5, per="epoch")
    assert s.lr_at(150, 100) == pytest.approx(0.72, abs=1e-12)  # epoch 1 for all its steps
    assert s.lr_at(199, 100) == s.lr_at(100, 100)
    z = LrScaling(base_lr=0.1, base_batch=256, batch=1024, warmup_epochs=2, start_lr=0.0)
    assert (z.lr_at(0, 10), z.lr_at(10, 10), z.lr_at(20, 10)) == (0.0, pytest.approx(0.2), 0.4)
    assert lr_at(5, base_lr=0.1, base_batch=256, batch=512, warmup=0) == 0.2


def test_warning_past_8k_only() -> None:
    assert PAPER.warnings == []
    big = LrScaling(base_lr=0.1, base_batch=256, batch=16384)
    assert len(big.warnings) == 1 and "8192" in big.warnings[0]


@pytest.mark.parametrize("kw", [dict(base_lr=0.0), dict(base_batch=0), dict(batch=-8),
                                dict(warmup_epochs=-1.0), dict(per="hour"), dict(start_lr=-1.0)])
def test_bad_values(kw: dict[str, object]) -> None:
    args: dict[str, object] = dict(base_lr=0.1, base_batch=256, batch=8192)
    with pytest.raises(BadInputError):
        LrScaling(**{**args, **kw})  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="step"):
        PAPER.lr_at(-1, 100)
