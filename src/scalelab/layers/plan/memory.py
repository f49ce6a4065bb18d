"""Bytes per rank of a transformer's training state and activations, by parallel strategy.

Model states (Rajbhandari et al. 2020, "ZeRO", §3.1): with Ψ parameters, mixed-precision Adam
holds 2Ψ (fp16 parameters) + 2Ψ (fp16 gradients) + KΨ optimizer bytes with K = 12 (fp32 master
copy, momentum, variance). The trainer here runs in fp32 on CPU, so its variant is
4Ψ + 4Ψ + KΨ with K = 8 (momentum and variance; the fp32 parameters are their own master copy):
16Ψ bytes per replica. Both are offered (`precision`). Per strategy on W ranks:

- dp: every rank holds all of it.
- fsdp (ZeRO-3): each rank holds 1/W of parameters, gradients and optimizer state.
- tp (Megatron-style, tensor-parallel degree W): every weight matrix and the embedding/output
  tables are split W ways; the RMSNorm weights ((2L + 1)·h of them) stay replicated.
- fsdp+tp (a 2-D mesh, W = d·t: TP of degree t inside each of d FSDP groups): the tp split
  above, then every tensor-parallel shard (and the replicated norms) sharded d ways.
- pp (W stages): a rank holds its ⌈L/W⌉ layers, plus the embedding on the first stage and the
  final norm and output head on the last; the plan reports the largest stage.

Activations (the bytes autograd saves for backward) follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", §4): per layer, s·b·h·(34 + 5as/h) bytes
for GPT-3 in 16-bit with dropout; with tensor parallelism (no sequence parallelism) the terms
inside attention and the MLP divide by t and the rest (layer-norm inputs, residual) do not:
s·b·h·(10 + 24/t + 5as/(ht)). The trainer's block is Llama's (RMSNorm, RoPE, grouped-query
attention, SwiGLU) in fp32 without dropout, so the same accounting is redone for it op by op
(`llama_layer_elements`, each term commented, checked storage by storage against what autograd
really keeps) and multiplied by 4 bytes. Attention runs in torch's fused
scaled_dot_product_attention, which saves the log-sum-exp (one value per head and token)
instead of the a·s² score matrix: the 5as/h term becomes a/h.

Pipeline activations: GPipe runs every micro-batch's forward before any backward, so every
stage holds m micro-batches of b/m sequences at once; under 1F1B stage i holds min(p − i, m)
(Narayanan et al. 2021): the first min(p, m), the last one. `plan_memory` counts these tensors
only; the process around them is `plan_peak_rss`'s (below).

Peak RSS (`plan_peak_rss`): what a user reads as a rank's peak is the process's resident set,
not its tensors. The plan adds, to the tensors above: the process baseline — the interpreter,
torch and the backend before the first tensor, which the planner cannot derive and takes as a
measured input (train.parallel.runtime measures it on the machine at hand and caches it) —, the
data the rank loads, and each strategy's communication buffers (DDP's bucket: a flat copy of
every gradient; FSDP's unsharded blocks: while block i runs backward, its parameters and
gradients whole and block i − 1's parameters prefetched; the pipeline's receive buffers: one
activation and one gradient per micro-batch). What it still leaves out is the allocator's
retention (freed memory glibc keeps mapped), which the benchmark measures as the remainder.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from scalelab.lab.core.errors import BadUsageError

Strategy = Literal["dp", "fsdp", "tp", "pp", "fsdp+tp"]
Precision = Literal["fp32", "mixed"]
Schedule = Literal["gpipe", "1f1b"]
STRATEGIES: tuple[str, ...] = ("dp", "fsdp", "tp", "pp", "fsdp+tp")

# Bytes per parameter: (parameters, gradients, optimizer state K).
STATE_BYTES: dict[str, tuple[int, int, int]] = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
ACT_BYTES: dict[str, int] = {"fp32": 4, "mixed": 2}


@dataclass(frozen=True, kw_only=True)
class MemoryQuery:
    """A transformer and how it is trained: what the planner is asked about."""

    params: int
    """Total parameters Ψ (embeddings included)."""
    layers: int
    """Transformer blocks L."""
    hidden: int
    """Model width h."""
    seq: int
    """Sequence length s (tokens per sequence)."""
    batch: int
    """Global batch in sequences per optimizer step (all ranks together)."""
    strategy: Strategy
    world: int
    """Ranks W (the data-, tensor- or pipeline-parallel degree)."""
    heads: int | None = None
    """Attention heads a; None means h / 64 (at least 1)."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None means `heads`."""
    ffn: int | None = None
    """SwiGLU inner width f; None means ⌈8h/3⌉."""
    vocab: int = 0
    """Vocabulary size V (0: unknown; the logits term and the pipeline's head split then drop)."""
    tied: bool = False
    """Input embedding and output head share one table."""
    precision: Precision = "fp32"
    micro_batches: int = 1
    """Micro-batches per step m (pipeline only)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: gpipe holds m micro-batches in flight, 1f1b at most min(p, m)."""
    tp: int = 2
    """Tensor-parallel degree t of fsdp+tp (the rest of `world` is FSDP's d = W/t)."""

    def __post_init__(self) -> None:
        for name in ("params", "layers", "hidden", "seq", "batch", "world", "micro_batches",
                     "tp"):
            if getattr(self, name) < 1:
                raise BadUsageError(f"--{name.replace('_', '-')} must be >= 1; "
                                    f"got {getattr(self, name)}")
        if self.strategy not in STRATEGIES:
            raise BadUsageError(f"--strategy must be one of {', '.join(STRATEGIES)}; "
                                f"got {self.strategy!r}")
        if self.precision not in STATE_BYTES:
            raise BadUsageError(f"--precision must be fp32 or mixed; got {self.precision!r}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise BadUsageError(f"--schedule must be gpipe or 1f1b; got {self.schedule!r}")
        if self.vocab < 0:
            raise BadUsageError(f"--vocab must be >= 0; got {self.vocab}")
        for name in ("heads", "kv_heads", "ffn"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise BadUsageError(f"--{name.replace('_', '-')} must be >= 1; got {v}")
        if self.kv_heads is not None and self.n_heads % self.kv_heads:
            raise BadUsageError(f"--heads {self.n_heads} is not a multiple of --kv-heads "
                                f"{self.kv_heads}")
        if self.hidden % self.n_heads:
            raise BadUsageError(f"--hidden {self.hidden} is not a multiple of --heads "
                                f"{self.n_heads}")
        if self.strategy == "pp" and self.world > self.layers:
            raise BadUsageError(f"pipeline over {self.world} stages needs at least as many "
                                f"layers; got --layers {self.layers}")
        if self.strategy == "pp" and self.batch % self.micro_batches:
            raise BadUsageError(f"--batch {self.batch} does not split into --micro-batches "
                                f"{self.micro_batches}")
        if self.strategy in ("dp", "fsdp") and self.batch % self.world:
            raise BadUsageError(f"--batch {self.batch} does not split over --world {self.world}")
        if self.strategy == "fsdp+tp" and self.world % self.tp:
            raise BadUsageError(f"fsdp+tp: --world {self.world} does not split into "
                                f"tensor-parallel groups of --tp {self.tp}")
        if self.strategy == "fsdp+tp" and self.batch % (self.world // self.tp):
            raise BadUsageError(f"--batch {self.batch} does not split over the "
                                f"{self.world // self.tp} FSDP groups (--world / --tp)")
        if self.embedding_params() >= self.params:
            raise BadUsageError(f"--params {self.params} is not more than the embedding tables "
                                f"alone ({self.embedding_params()} = vocab × hidden)")

    @property
    def n_heads(self) -> int:
        return self.heads if self.heads is not None else max(1, self.hidden // 64)

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn if self.ffn is not None else math.ceil(8 * self.hidden / 3)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Predicted bytes on the busiest rank."""

    strategy: str
    world: int
    precision: str
    params_per_rank: int
    """Parameters this rank holds (elements)."""
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    total_bytes: int
    """The four above together: the model's share of the rank's peak."""
    tokens_per_micro_batch: int
    """Tokens one forward on this rank processes (sequences × seq)."""
    in_flight: int
    """Micro-batches whose activations are held at once (1 outside the pipeline)."""
    formulas: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def llama_layer_elements(*, tokens: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                         tp: int = 1) -> int:
    """Activation elements one Llama block saves for backward over `tokens` tokens.

    Per token, with kv = kv_heads · h / heads the key/value width, op by op (fp32, no dropout;
    checked against a saved-tensor hook, storage by storage, on torch 2.13 CPU):
      each RMSNorm (two per block): its input x (h), 1/rms (1), x/rms (h, kept by the
        multiply with the weight) and its output (h, kept by the next projections)  2 x (3h + 1)
      RoPE: only cos and sin (a model-level term: `rope_elements`); q and k are not kept
      fused attention: q (h), k and v at their own width (kv + kv: grouped-query attention
        is not expanded in what is kept), the output (h, which o_proj reads as a view) and the
        log-sum-exp (a)                                                          2h + 2kv + a
      SwiGLU: gate's output (f, kept by SiLU), SiLU's output and up's output (f + f, kept by the
        product), the product (f, kept by down_proj)                              4f
    Under tensor parallelism of degree t the attention and MLP terms split t ways (each rank has
    1/t of the heads and of f); the norms' terms, on the replicated residual stream, do not —
    Korthikanti's 10 + 24/t split, for this block: (6h + 2) + (2h + 2kv + a + 4f)/t.
    """
    kv = kv_heads * (hidden // heads)
    replicated = 6 * hidden + 2
    split = 2 * hidden + 2 * kv + heads + 4 * ffn
    return tokens * replicated + -(-tokens * split // tp)


def rope_elements(*, tokens: int, head_dim: int) -> int:
    """cos and sin for every token (b·t·d each), computed once per forward (once per pipeline
    stage) and shared by every layer's q and k."""
    return tokens * 2 * head_dim


def head_elements(*, tokens: int, hidden: int, vocab: int) -> int:
    """The final RMSNorm (3h + 1, as in a block) and the loss's log-softmax over V logits.

    Under tensor parallelism the logits are gathered whole on every rank before the loss.
    """
    return tokens * (3 * hidden + 1 + vocab)


INDEX_BYTES = 8
"""int64 token ids (kept by the embedding) and targets (kept by the loss), per token each."""


def plan_memory(q: MemoryQuery) -> MemoryPlan:
    """Bytes per rank for `q` (the busiest rank where ranks differ)."""
    pb, gb, k = STATE_BYTES[q.precision]
    ab = ACT_BYTES[q.precision]
    w, L, h = q.world, q.layers, q.hidden
    norms = (2 * L + 1) * h
    emb_each = q.vocab * h
    per_layer = (q.params - q.embedding_params() - h) / L  # final norm apart
    layer_kw = {"hidden": h, "heads": q.n_heads, "kv_heads": q.n_kv_heads, "ffn": q.ffn_dim}
    d = h // q.n_heads

    def whole_model(tokens: int, tp: int = 1) -> int:
        """Bytes of activations of the whole model over `tokens` tokens."""
        elements = (L * llama_layer_elements(tokens=tokens, tp=tp, **layer_kw)
                    + rope_elements(tokens=tokens, head_dim=d)
                    + head_elements(tokens=tokens, hidden=h, vocab=q.vocab))
        return ab * elements + 2 * INDEX_BYTES * tokens

    in_flight = 1
    if q.strategy == "dp":
        psi = q.params
        tokens = q.seq * q.batch // w
        act_b = whole_model(tokens)
        f_psi, f_act = "Ψ", "L·layer(s·b/W) + rope + head + ids"
    elif q.strategy == "fsdp":
        psi = math.ceil(q.params / w)
        tokens = q.seq * q.batch // w
        act_b = whole_model(tokens)
        f_psi, f_act = "⌈Ψ/W⌉", "L·layer(s·b/W) + rope + head + ids"
    elif q.strategy == "tp":
        psi = math.ceil((q.params - norms) / w) + norms
        tokens = q.seq * q.batch
        act_b = whole_model(tokens, tp=w)
        f_psi, f_act = "⌈(Ψ − (2L+1)h)/W⌉ + (2L+1)h", "L·layer_t(s·b) + rope + head + ids"
    elif q.strategy == "fsdp+tp":
        t, dp = q.tp, w // q.tp
        psi = math.ceil((math.ceil((q.params - norms) / t) + norms) / dp)
        tokens = q.seq * q.batch // dp
        act_b = whole_model(tokens, tp=t)
        f_psi = "⌈(⌈(Ψ − (2L+1)h)/t⌉ + (2L+1)h)/d⌉"
        f_act = "L·layer_t(s·b/d) + rope + head + ids"
    else:
        # Stages take ⌈L/W⌉ layers from the front; the first stage also holds the embedding
        # (and the token ids), the last the final norm, the output head (its own copy when
        # tied), the logits and the targets. Each stage computes its own cos/sin.
        stage_layers = math.ceil(L / w)
        last_layers = L - (w - 1) * stage_layers if w > 1 else L
        tokens = q.seq * q.batch // q.micro_batches
        first_in_flight = q.micro_batches if q.schedule == "gpipe" else min(w, q.micro_batches)
        # Under 1F1B the last stage runs each micro-batch's backward right after its forward;
        # under GPipe it too runs all m forwards first.
        last_in_flight = q.micro_batches if q.schedule == "gpipe" else 1
        layer_act = llama_layer_elements(tokens=tokens, **layer_kw)
        rope = rope_elements(tokens=tokens, head_dim=d)
        head = head_elements(tokens=tokens, hidden=h, vocab=q.vocab)
        first_psi = math.ceil(stage_layers * per_layer) + emb_each
        last_psi = math.ceil(last_layers * per_layer) + h + emb_each
        first_b = first_in_flight * (ab * (stage_layers * layer_act + rope)
                                     + INDEX_BYTES * tokens)
        last_b = last_in_flight * (ab * (last_layers * layer_act + rope + head)
                                   + INDEX_BYTES * tokens)
        if w == 1:
            psi, act_b = q.params, first_in_flight * whole_model(tokens)
            in_flight = first_in_flight
        elif (pb + gb + k) * first_psi + first_b >= (pb + gb + k) * last_psi + last_b:
            psi, act_b, in_flight = first_psi, first_b, first_in_flight
        else:
            psi, act_b, in_flight = last_psi, last_b, last_in_flight
        f_psi = "busiest of ⌈L/W⌉·Ψ_layer + Vh (first stage), rest + h + Vh (last stage)"
        f_act = (f"{'m' if q.schedule == 'gpipe' else 'min(W, m)'}·(⌈L/W⌉·layer(s·b/m) + rope + "
                 f"ids) (first), {'m·' if q.schedule == 'gpipe' else ''}(layers_last·"
                 "layer(s·b/m) + rope + head + targets) (last)")
    act_bytes = act_b
    formulas = {
        "params": f"{pb}·{f_psi}", "grads": f"{gb}·{f_psi}", "optimizer": f"{k}·{f_psi}",
        "activations": f"{ab} bytes·({f_act})",
        "state_variant": ("fp32 Adam: 4Ψ + 4Ψ + 8Ψ" if q.precision == "fp32"
                          else "mixed-precision Adam (ZeRO): 2Ψ + 2Ψ + 12Ψ"),
    }
    return MemoryPlan(
        strategy=q.strategy, world=w, precision=q.precision, params_per_rank=psi,
        param_bytes=pb * psi, grad_bytes=gb * psi, optimizer_bytes=k * psi,
        activation_bytes=act_bytes, total_bytes=(pb + gb + k) * psi + act_bytes,
        tokens_per_micro_batch=tokens, in_flight=in_flight, formulas=formulas)


@dataclass(frozen=True, kw_only=True)
class PeakPlan:
    """Predicted peak resident bytes of the busiest rank's process."""

    runtime_bytes: int
    """The process baseline before any tensor (measured, an input)."""
    data_bytes: int
    """The training data the rank holds in memory (an input)."""
    tensor_bytes: int
    """plan_memory's total: parameters, gradients, optimizer state, saved activations."""
    buffer_bytes: int
    """The strategy's communication buffers (see the module doc)."""
    peak_rss_bytes: int
    """The four together."""
    buffer_formula: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def buffer_bytes(q: MemoryQuery) -> tuple[int, str]:
    """The strategy's communication buffers on the busiest rank, and their formula."""
    pb, gb, _ = STATE_BYTES[q.precision]
    ab = ACT_BYTES[q.precision]
    layer = math.ceil((q.params - q.embedding_params() - q.hidden) / q.layers)
    if q.world == 1:
        return 0, "0 (one rank)"
    if q.strategy == "dp":
        return gb * q.params, f"{gb}·Ψ (DDP's bucket: every gradient, flat)"
    if q.strategy == "fsdp":
        return ((2 * pb + gb) * layer,
                f"({2 * pb} + {gb})·Ψ_layer (a block's parameters and gradients whole, the next "
                "block's parameters prefetched)")
    if q.strategy == "fsdp+tp":
        # FSDP's unsharded blocks, each a tensor-parallel shard (the block's norms whole).
        shard = math.ceil((layer - 2 * q.hidden) / q.tp) + 2 * q.hidden
        if q.world == q.tp:
            return 0, "0 (one FSDP group: nothing to gather)"
        return ((2 * pb + gb) * shard,
                f"({2 * pb} + {gb})·(⌈(Ψ_layer − 2h)/t⌉ + 2h) (FSDP's whole block and the next "
                "one's parameters, each the tensor-parallel shard)")
    if q.strategy == "pp":
        tokens = q.seq * q.batch // q.micro_batches
        return (2 * q.micro_batches * tokens * q.hidden * ab,
                f"2·m·(s·b/m)·h·{ab} (a receive buffer per micro-batch, activations and "
                "gradients)")
    return 0, "0 (TP's collectives work on the activations counted above)"


def plan_peak_rss(q: MemoryQuery, *, runtime_bytes: int, data_bytes: int = 0) -> PeakPlan:
    """plan_memory's tensors plus the measured process baseline, the data and the strategy's
    buffers: the busiest rank's predicted peak RSS."""
    if runtime_bytes < 0 or data_bytes < 0:
        raise BadUsageError(f"--runtime-bytes and --data-bytes must be >= 0; got "
                            f"{runtime_bytes}, {data_bytes}")
    tensors = plan_memory(q).total_bytes
    buf, formula = buffer_bytes(q)
    return PeakPlan(runtime_bytes=runtime_bytes, data_bytes=data_bytes, tensor_bytes=tensors,
                    buffer_bytes=buf, peak_rss_bytes=runtime_bytes + data_bytes + tensors + buf,
                    buffer_formula=formula)
