"""plan.memory: bytes per rank by strategy, against values derived by hand."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.plan.memory import (
    MemoryQuery,
    head_elements,
    llama_layer_elements,
    plan_memory,
    plan_peak_rss,
    rope_elements,
)

# Ψ = 1,000,000, L = 4, h = 128, s = 128, b = 8 sequences, V = 256 (untied), heads 128/64 = 2,
# kv heads 2 (kv width 128), f = ⌈8·128/3⌉ = 342.
BASE = {"params": 1_000_000, "layers": 4, "hidden": 128, "seq": 128, "batch": 8, "vocab": 256}


def q(**kw: object) -> MemoryQuery:
    return MemoryQuery(**{**BASE, **kw})  # type: ignore[arg-type]


def test_layer_elements_per_token_by_hand() -> None:
    # not split: two norms x (3h + 1) = 770; split: 2h + 2kv + a + 4f = 256 + 256 + 2 + 1368
    # = 1882 (kv = h without grouped-query attention).
    assert llama_layer_elements(tokens=1, hidden=128, heads=2, kv_heads=2, ffn=342) == 2652
    # t = 4, 10 tokens: 10 x 770 + ⌈10 x 1882 / 4⌉ = 7700 + 4705.
    assert llama_layer_elements(tokens=10, hidden=128, heads=2, kv_heads=2, ffn=342,
                                tp=4) == 12405
    # GQA, 1 kv head of width 64: k and v are kept at 64 each: 2652 − 2 x 64.
    assert llama_layer_elements(tokens=1, hidden=128, heads=2, kv_heads=1, ffn=342) == 2524
    assert rope_elements(tokens=3, head_dim=64) == 384
    assert head_elements(tokens=2, hidden=128, vocab=256) == 2 * 641


def test_dp_holds_everything_fp32_adam_16_bytes_per_param() -> None:
    p = plan_memory(q(strategy="dp", world=4))
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes) == (4_000_000, 4_000_000, 8_000_000)
    # 256 tokens per rank: 4 layers x 256 x 2652 + rope 256 x 2d (128) + head 256 x
    # (3h + 1 + V = 641) = 2,912,512 elements x 4 bytes, + 16 bytes per token of int64 ids and
    # targets.
    assert p.tokens_per_micro_batch == 256
    assert p.activation_bytes == 4 * 2_912_512 + 16 * 256 == 11_654_144
    assert p.total_bytes == 16_000_000 + 11_654_144


def test_mixed_precision_is_zero_papers_2_2_12() -> None:
    p = plan_memory(q(strategy="dp", world=1, precision="mixed"))
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes) == (2_000_000, 2_000_000, 12_000_000)
    # 1024 tokens: 4 x 1024 x 2652 + 1024 x 128 + 1024 x 641 = 11,650,048 elements x 2 bytes.
    assert p.activation_bytes == 2 * 11_650_048 + 16 * 1024


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
    # The whole batch (1024 tokens) on every rank; per layer 1024 x 770 + 1024 x 1882 / 4 =
    # 1,270,272; x 4 layers + rope 131,072 + head 656,384 = 5,868,544 elements.
    assert p.tokens_per_micro_batch == 1024
    assert p.activation_bytes == 4 * 5_868_544 + 16 * 1024


def test_fsdp_tp_shards_the_tensor_parallel_split_over_the_fsdp_groups() -> None:
    p = plan_memory(q(strategy="fsdp+tp", world=4, tp=2))
    # TP of 2: ⌈(1,000,000 − 1152)/2⌉ + 1152 = 500,576; FSDP over 4/2 = 2 groups: 250,288.
    assert p.params_per_rank == 250_288
    assert p.total_bytes - p.activation_bytes == 16 * 250_288
    # 512 tokens a rank (the batch split over 2 groups); per layer 512 x 770 + 512 x 1882 / 2 =
    # 876,032; x 4 layers + rope 512 x 128 + head 512 x 641 = 3,897,856 elements; + int64 ids.
    assert p.tokens_per_micro_batch == 512
    assert p.activation_bytes == 4 * 3_897_856 + 16 * 512
    # Degenerate meshes are the one-dimensional strategies.
    tp = plan_memory(q(strategy="tp", world=4))
    one_group = plan_memory(q(strategy="fsdp+tp", world=4, tp=4))
    assert (one_group.params_per_rank, one_group.activation_bytes) == (tp.params_per_rank,
                                                                       tp.activation_bytes)
    fsdp = plan_memory(q(strategy="fsdp", world=4))
    no_tp = plan_memory(q(strategy="fsdp+tp", world=4, tp=1))
    assert (no_tp.params_per_rank, no_tp.activation_bytes) == (fsdp.params_per_rank,
                                                               fsdp.activation_bytes)
    # FSDP's whole blocks are TP shards: Ψ_layer 233,584 → ⌈(233,584 − 256)/2⌉ + 256 = 116,920,
    # two blocks' parameters and one's gradients: 12 x 116,920.
    buf = plan_peak_rss(q(strategy="fsdp+tp", world=4, tp=2), runtime_bytes=0).buffer_bytes
    assert buf == 1_403_040


def test_pp_busiest_stage_and_schedules() -> None:
    # Ψ_layer = (1,000,000 − 2·256·128 − 128)/4 = 233,584; 2 stages of 2 layers.
    # first: 467,168 + 32,768 = 499,936; last: 467,168 + 128 + 32,768 = 500,064.
    # 1F1B, m = 4, micro-batch 2 sequences = 256 tokens, layer 678,912, rope 32,768, head
    # 164,096 elements; ids / targets 2,048 bytes.
    # first holds min(2, 4) = 2: 2 x (4 x (2 x 678,912 + 32,768) + 2,048) = 11,128,832 bytes;
    # last holds 1: 4 x (2 x 678,912 + 32,768 + 164,096) + 2,048 = 6,220,800.
    # first total 16 x 499,936 + 11,128,832 > last 16 x 500,064 + 6,220,800.
    p = plan_memory(q(strategy="pp", world=2, micro_batches=4))
    assert (p.params_per_rank, p.in_flight, p.activation_bytes) == (499_936, 2, 11_128_832)
    # GPipe: both stages hold all 4; the last (4 x 6,220,800) beats the first (4 x 5,564,416).
    g = plan_memory(q(strategy="pp", world=2, micro_batches=4, schedule="gpipe"))
    assert (g.params_per_rank, g.in_flight, g.activation_bytes) == (500_064, 4, 24_883_200)
    # One micro-batch of 1024 tokens: each stage holds one; the last (head, logits) is busiest:
    # 4 x (2 x 2,715,648 + 131,072 + 656,384) + 8,192.
    one = plan_memory(q(strategy="pp", world=2, micro_batches=1))
    assert (one.params_per_rank, one.activation_bytes) == (500_064, 24_883_200)


@pytest.mark.parametrize("kw, needle", [
    ({"strategy": "pp", "world": 8}, "at least as many layers"),
    ({"strategy": "dp", "world": 3}, "does not split over --world 3"),
    ({"strategy": "dp", "world": 1, "heads": 3}, "not a multiple of --heads"),
    ({"strategy": "dp", "world": 1, "heads": 4, "kv_heads": 3}, "not a multiple of --kv-heads"),
    ({"strategy": "dp", "world": 1, "params": 60_000}, "embedding tables"),
    ({"strategy": "zz", "world": 1}, "--strategy must be one of"),
    ({"strategy": "pp", "world": 2, "micro_batches": 3}, "--micro-batches 3"),
    ({"strategy": "fsdp+tp", "world": 4, "tp": 3}, "groups of --tp 3"),
    ({"strategy": "fsdp+tp", "world": 4, "tp": 2, "batch": 3}, "the 2 FSDP groups"),
    ({"strategy": "fsdp+tp", "world": 4, "tp": 0}, "--tp must be >= 1"),
])
def test_bad_queries_name_the_flag(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(BadUsageError, match=needle):
        q(**kw)


def test_peak_rss_adds_the_measured_runtime_the_data_and_the_strategys_buffers() -> None:
    dp = plan_peak_rss(q(strategy="dp", world=4), runtime_bytes=300_000_000, data_bytes=1_000)
    # DDP's bucket is every gradient again: 4 bytes x 1,000,000.
    assert (dp.tensor_bytes, dp.buffer_bytes) == (16_000_000 + 11_654_144, 4_000_000)
    assert dp.peak_rss_bytes == 300_000_000 + 1_000 + 27_654_144 + 4_000_000
    # Ψ_layer = (1,000,000 - 2 x 256 x 128 - 128) / 4 = 233,584; FSDP holds two blocks'
    # parameters and one block's gradients whole: (8 + 4) x 233,584.
    assert plan_peak_rss(q(strategy="fsdp", world=4), runtime_bytes=0).buffer_bytes == 2_803_008
    # Pipeline, m = 4: 256 tokens per micro-batch, a width-128 fp32 receive buffer for the
    # activations and one for their gradients, per micro-batch: 2 x 4 x 256 x 128 x 4.
    pp = plan_peak_rss(q(strategy="pp", world=2, micro_batches=4), runtime_bytes=0)
    assert pp.buffer_bytes == 1_048_576
    assert plan_peak_rss(q(strategy="tp", world=2), runtime_bytes=0).buffer_bytes == 0
    assert plan_peak_rss(q(strategy="dp", world=1), runtime_bytes=5).peak_rss_bytes == \
        5 + plan_memory(q(strategy="dp", world=1)).total_bytes
    with pytest.raises(BadUsageError, match="--runtime-bytes"):
        plan_peak_rss(q(strategy="dp", world=1), runtime_bytes=-1)
