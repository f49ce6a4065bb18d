"""The engine's flat forward (generate/forward.py) against the model's module forward: the same
logits bit for bit at every weight setting, fused int4 projections equal to the separate ones,
the weights stored once."""

from __future__ import annotations

import pytest
import torch

from scalelab.layers.nets.llama import LlamaForCausalLM, build_tiny, tiny_config
from scalelab.system.generate.forward import StepForward, fuse_projections
from scalelab.system.generate.linears import FusedInt4, Int4Linear, weight_bytes
from scalelab.system.generate.models import load_model
from scalelab.system.generate.quant import quantize_q4
from scalelab.system.generate.runner import ModelRunner, PagedAttention, SeqSlice


def _wide_q4() -> LlamaForCausalLM:
    """The tiny model with 64-wide heads, so that q, k and v (128, 64, 64 rows) are whole
    blocks of the int4 packer and fuse (the default tiny model's k/v have 32 rows)."""
    cfg = tiny_config()
    cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads = 128, 2, 1
    model = build_tiny(seed=5, cfg=cfg)
    quantize_q4(model)
    return model


def _slices() -> list[SeqSlice]:
    # A prefill chunk beside single decode tokens, non-contiguous block tables.
    return [
        SeqSlice(tokens=list(range(40, 51)), start=0, block_table=[5, 0, 9], logits_rows=11),
        SeqSlice(tokens=[7], start=6, block_table=[1, 8], logits_rows=1),
        SeqSlice(tokens=[99, 3], start=3, block_table=[2, 3], logits_rows=1),
    ]


def _run(forward: object, runner: ModelRunner, slices: list[SeqSlice]) -> torch.Tensor:
    ids = torch.tensor([t for s in slices for t in s.tokens])[None]
    pos = torch.cat([torch.arange(s.start, s.start + len(s.tokens)) for s in slices])[None]
    rows, end = [], 0
    for s in slices:
        end += len(s.tokens)
        rows.extend(range(end - s.logits_rows, end))
    att = PagedAttention(runner.k_cache, runner.v_cache, slices, runner.block_size)
    with torch.inference_mode():
        if isinstance(forward, StepForward):
            return forward(ids, pos, att, torch.tensor(rows))
        return runner.model(ids, pos, att, logits_at=torch.tensor(rows))


@pytest.mark.parametrize("weights", ["fp32", "int8", "q4", "q4-wide"])
def test_step_forward_is_the_module_forward_bit_for_bit(weights: str) -> None:
    model = _wide_q4() if weights == "q4-wide" else load_model("tiny", weights=weights).model
    runner = ModelRunner(model, num_blocks=12, block_size=4)
    layer = model.model.layers[0]
    # q4: gate/up (128 rows each) fuse; q/k/v only where k and v are 64 rows.
    assert isinstance(getattr(layer.mlp, "gate_up", None), FusedInt4) == weights.startswith("q4")
    assert isinstance(getattr(layer.self_attn, "qkv", None), FusedInt4) == (weights == "q4-wide")
    # The module path first (it fills the cache the same way), then the flat one.
    want = _run(runner.model, runner, _slices())
    runner.k_cache.zero_()
    runner.v_cache.zero_()
    got = _run(runner.forward, runner, _slices())
    assert got.shape == (13, model.cfg.vocab_size)
    assert torch.equal(got, want)


def test_fused_int4_is_its_parts_bit_for_bit_and_stored_once() -> None:
    model = _wide_q4()
    attn = model.model.layers[1].self_attn
    before = weight_bytes(model)
    x = torch.randn(5, attn.q_proj.in_features, generator=torch.Generator().manual_seed(3))
    want = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
    assert fuse_projections(model) == 2 * model.cfg.num_layers  # qkv and gate_up
    assert fuse_projections(model) == 0
    got = attn.qkv(x.to(attn.qkv.dtype)).split_with_sizes(attn.qkv.sizes, dim=-1)
    assert [g.shape[-1] for g in got] == [128, 64, 64]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # The parts still run alone, from views of the fused rows.
    assert torch.equal(attn.k_proj(x), want[1])
    assert attn.k_proj.packed0.data_ptr() == (
        attn.qkv.packed.data_ptr() + attn.q_proj.out_features * attn.qkv.packed.stride(0)
    )
    # Only the fused copies of the (small) scales are new.
    extra = sum(f.scale_zero.numel() * 2 for f in model.modules() if isinstance(f, FusedInt4))
    assert weight_bytes(model) == before + extra
    assert not any(".qkv." in k or ".gate_up." in k for k in model.state_dict())


def test_padded_or_two_part_int4_is_not_fused() -> None:
    lm = load_model("tiny", weights="q4")
    head = lm.model.lm_head
    assert isinstance(head, Int4Linear) and head.num_parts == 2  # Q8_0: two int4 operands
    assert not FusedInt4.fusable([head, head])
    attn = load_model("tiny", weights="q4").model.model.layers[0].self_attn
    assert not FusedInt4.fusable([attn.q_proj, attn.k_proj])  # k: 32 rows, half a block
    assert not FusedInt4.fusable([torch.nn.Linear(4, 4, bias=False)])


def test_one_sequence_on_consecutive_blocks_reads_the_cache_in_place() -> None:
    # The same sequence on consecutive blocks (a slice of the cache, no gather) and on
    # scattered ones (the gather): the same logits bit for bit, and only the first in place.
    model = load_model("tiny", weights="q4").model
    runner = ModelRunner(model, num_blocks=12, block_size=4)
    got = {}
    for table in ([3, 4, 5], [9, 0, 6]):
        prompt = SeqSlice(tokens=list(range(30, 39)), start=0, block_table=table, logits_rows=1)
        step = SeqSlice(tokens=[17], start=9, block_table=table, logits_rows=1)
        att = PagedAttention(runner.k_cache, runner.v_cache, [step], runner.block_size)
        assert (att.span is not None) == (table == [3, 4, 5])
        _run(runner.forward, runner, [prompt])
        got[table[0]] = _run(runner.forward, runner, [step])
    assert torch.equal(got[3], got[9])
