"""nets/llama.py's config: the head split checked at construction (the model against
transformers' Llama is tests/system/generate/test_llama.py, which runs it in the engine)."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.llama import LlamaConfig, tiny_config


def test_config_rejects_bad_head_split() -> None:
    with pytest.raises(BadInputError, match="num_kv_heads"):
        LlamaConfig(
            vocab_size=10,
            hidden_size=64,
            intermediate_size=8,
            num_layers=1,
            num_heads=4,
            num_kv_heads=3,
        )
    assert tiny_config().head_dim == 16
