"""The Llama decoder architecture (RMSNorm, RoPE, grouped-query attention, SwiGLU) in plain torch.

Parameter names follow Hugging Face's LlamaForCausalLM (`model.layers.0.self_attn.q_proj.weight`,
...), so a state dict moves between the two unchanged and transformers can check this forward.

Two uses share one module:
- training and plain scoring: `model(input_ids)` with input_ids (batch, time) is a causal forward
  over the whole sequence, returning logits (batch, time, vocab);
- generation: the engine passes `attention=` an object that owns a (paged) KV cache. Each layer
  hands it the new tokens' queries, keys and values; it stores the keys and values and returns
  the attention output over everything cached. The architecture knows nothing of pages or blocks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.lab.core.errors import BadInputError


@dataclass(kw_only=True)
class LlamaConfig:
    """Shape of a Llama decoder (the names are those of a GGUF file's `llama.*` metadata)."""

    vocab_size: int
    """Tokens in the vocabulary (rows of the embedding)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU feed-forward layer."""
    num_layers: int
    """Decoder blocks."""
    num_heads: int
    """Query heads per attention layer."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention: each serves num_heads // num_kv_heads queries)."""
    rope_theta: float = 10000.0
    """Base of the rotary position frequencies."""
    rms_norm_eps: float = 1e-5
    """Epsilon inside RMSNorm's square root."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt + output) the model is used for; sizes the RoPE table."""
    tie_word_embeddings: bool = True
    """The output projection shares the input embedding's weights (SmolLM2 does)."""

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.hidden_size, self.intermediate_size, self.num_layers) < 1:
            raise BadInputError(
                "vocab_size, hidden_size, intermediate_size, num_layers must be >= 1"
            )
        if self.num_heads < 1 or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise BadInputError(
                f"num_heads={self.num_heads} must be a positive multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise BadInputError(
                f"hidden_size={self.hidden_size} must split into num_heads={self.num_heads} "
                "heads of even width (RoPE rotates pairs)"
            )
        if self.max_position_embeddings < 1 or self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise BadInputError("max_position_embeddings, rope_theta, rms_norm_eps must be > 0")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def tiny_config(vocab_size: int = 262, max_position_embeddings: int = 512) -> LlamaConfig:
    """A model of the same architecture that builds in milliseconds (tests, examples).

    The default vocabulary is the byte-level tokenizer's (256 bytes + special tokens).
    """
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=max_position_embeddings,
    )


class AttentionBackend(Protocol):
    """Where keys and values live during generation (see scalelab.system.generate.runner).

    q: (batch, time, num_heads, head_dim); k, v: (batch, time, num_kv_heads, head_dim), already
    rotated. Returns (batch, time, num_heads, head_dim).
    """

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised in fp32 whatever the weights' dtype, as the reference implementation does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_position_embeddings (rotate-half layout)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        # Buffers, not parameters: they follow .to(device) but are not in the state dict.
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if int(positions.max()) >= self.cos.shape[0]:
            raise BadInputError(
                f"position {int(positions.max())} is past max_position_embeddings="
                f"{self.cos.shape[0]}; shorten the sequence or raise the limit"
            )
        return self.cos[positions], self.sin[positions]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, time, heads, head_dim); cos/sin: (batch, time, head_dim)."""
    cos = cos.unsqueeze(2).to(x.dtype)
    sin = sin.unsqueeze(2).to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if attention is not None:
            out = attention(self.layer, q, k, v)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=self.num_heads != self.num_kv_heads,
            ).transpose(1, 2)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder stack without the output projection (HF's `model.` prefix)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(
                input_ids
            )
        cos, sin = self.rotary(positions)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attention)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Decoder + output projection. `forward(input_ids)` -> logits (batch, time, vocab)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention: AttentionBackend | None = None,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for every position, or only at the flat token indices `logits_at`.

        Generation needs one row per sequence (its last token), not the whole (time, vocab)
        table: projecting only those rows saves most of the output layer's cost in a prefill.
        """
        h = self.model(input_ids, positions, attention)
        if logits_at is not None:
            h = h.reshape(-1, h.shape[-1])[logits_at]
        return self.lm_head(h)


def init_weights(model: LlamaForCausalLM, seed: int = 0, std: float = 0.02) -> LlamaForCausalLM:
    """Seeded normal init (the same numbers on every machine for a given seed)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def build_tiny(seed: int = 0, cfg: LlamaConfig | None = None) -> LlamaForCausalLM:
    """A seeded tiny Llama (tiny_config() unless cfg is given), in eval mode.

    The decoder layers' projections are drawn at std 1/sqrt(fan-in), the embedding at 0.02, so
    the layers, not the last token's own embedding, decide the next token: at 0.02 throughout,
    the residual stream is the last embedding and greedy decoding repeats the last prompt token
    (`[164] * 12` for every prompt), and a check that the engine equals plain greedy compares
    constants (a dropped padding mask passed them all, issue #47).
    """
    model = init_weights(LlamaForCausalLM(cfg or tiny_config()), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in f".{name}" and name.endswith("proj.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    return model.eval()
