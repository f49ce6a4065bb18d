"""core.memory: bytes per rank by strategy, against values derived by hand."""

from __future__ import annotations

import pytest

from scalelab.core.errors import BadUsageError
from scalelab.core.memory import MemoryQuery, llama_layer_elements, plan_memory

# Ψ = 1,000,000, L = 4, h = 128, s = 128, b = 8 sequences, V = 256 (untied), heads 128/64 = 2,
# kv heads 2 (kv width 128), f = ⌈8·128/3⌉ = 342.
BASE = {"params": 1_000_000, "layers": 4, "hidden": 128, "seq": 128, "batch": 8, "vocab": 256}


def q(**kw: object) -> MemoryQuery:
    return MemoryQuery(**{**BASE, **kw})  # type: ignore[arg-type]


def test_layer_elements_per_token_by_hand() -> None:
    # replicated: (h+1) + h + (h+1) + h = 514; split: (h+kv) + 2h + (h+a) + h + 4f
    # = 256 + 256 + 130 + 128 + 1368 = 2138.
    assert llama_layer_elements(tokens=1, hidden=128, heads=2, kv_heads=2, ffn=342) == 2652
    # t = 4: 514 per token + ⌈10 · 2138 / 4⌉ = 5140 + 5345 for 10 tokens.
    assert llama_layer_elements(tokens=10, hidden=128, heads=2, kv_heads=2, ffn=342,
                                tp=4) == 10485
    # GQA, 1 kv head of width 64: the RoPE term is h + 64.
    assert llama_layer_elements(tokens=1, hidden=128, heads=2, kv_heads=1, ffn=342) == 2588


def test_dp_holds_everything_fp32_adam_16_bytes_per_param() -> None:
    p = plan_memory(q(strategy="dp", world=4))
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes) == (4_000_000, 4_000_000, 8_000_000)
    # 256 tokens per rank; 4 layers x 256 x 2652 + head 256 x (2h + 1 + V = 513), x 4 bytes.
    assert p.tokens_per_micro_batch == 256
    assert p.activation_bytes == 4 * (4 * 256 * 2652 + 256 * 513) == 11_387_904
    assert p.total_bytes == 16_000_000 + 11_387_904


def test_mixed_precision_is_zero_papers_2_2_12() -> None:
    p = plan_memory(q(strategy="dp", world=1, precision="mixed"))
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes) == (2_000_000, 2_000_000, 12_000_000)
    assert p.activation_bytes == 2 * (4 * 1024 * 2652 + 1024 * 513)


def test_fsdp_shards_all_three_states() -> None:
    p = plan_memory(q(strategy="fsdp", world=4))
    assert p.params_per_rank == 250_000
    assert p.total_bytes - p.activation_bytes == 16 * 250_000
    assert p.activation_bytes == plan_memory(q(strategy="dp", world=4)).activation_bytes
    assert plan_memory(q(strategy="fsdp", world=3, batch=9)).params_per_rank == 333_334


def test_tp_keeps_the_norms_replicated() -> None:
    p = plan_memory(q(strategy="tp", world=4))
    # norms (2L + 1)h = 1152 stay whole; ⌈(1,000,000 − 1152)/4⌉ = 249,712 split.
    assert p.params_per_rank == 249_712 + 1152
    # The whole batch (1024 tokens) on every rank; per layer 1024 x 514 + ⌈1024 x 2138/4⌉.
    assert p.tokens_per_micro_batch == 1024
    assert p.activation_bytes == 4 * (4 * (1024 * 514 + 547_328) + 1024 * 513)


def test_pp_busiest_stage_and_schedules() -> None:
    # Ψ_layer = (1,000,000 − 2·256·128 − 128)/4 = 233,584; 2 stages of 2 layers.
    # first: 467,168 + 32,768 = 499,936; last: 467,168 + 128 + 32,768 = 500,064.
    # 1F1B, m = 4, micro-batch 2 sequences = 256 tokens: first holds min(2, 4) = 2 in flight:
    # 2 x 2 x 256 x 2652 = 2,715,648 elements; last holds 2 x 256 x 2652 + 256 x 513 = 1,489,152.
    # first total 16 x 499,936 + 4 x 2,715,648 > last 16 x 500,064 + 4 x 1,489,152.
    p = plan_memory(q(strategy="pp", world=2, micro_batches=4))
    assert (p.params_per_rank, p.in_flight, p.activation_bytes) == (499_936, 2, 4 * 2_715_648)
    # GPipe: both stages hold all 4; the last adds the head: 4 x (1,357,824 + 131,328) =
    # 5,956,608 elements > the first's 4 x 2 x 256 x 2652 = 5,431,296.
    g = plan_memory(q(strategy="pp", world=2, micro_batches=4, schedule="gpipe"))
    assert (g.params_per_rank, g.in_flight, g.activation_bytes) == (500_064, 4, 4 * 5_956_608)
    # One micro-batch: both stages hold one; the last stage (head and logits) is the busiest.
    one = plan_memory(q(strategy="pp", world=2, micro_batches=1))
    assert one.params_per_rank == 500_064
    assert one.activation_bytes == 4 * (2 * 1024 * 2652 + 1024 * 513)


@pytest.mark.parametrize("kw, needle", [
    ({"strategy": "pp", "world": 8}, "at least as many layers"),
    ({"strategy": "dp", "world": 3}, "does not split over --world 3"),
    ({"strategy": "dp", "world": 1, "heads": 3}, "not a multiple of --heads"),
    ({"strategy": "dp", "world": 1, "params": 60_000}, "embedding tables"),
    ({"strategy": "zz", "world": 1}, "--strategy must be one of"),
    ({"strategy": "pp", "world": 2, "micro_batches": 3}, "--micro-batches 3"),
])
def test_bad_queries_name_the_flag(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(BadUsageError, match=needle):
        q(**kw)
