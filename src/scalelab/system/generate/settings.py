"""What `scalelab generate serve` configures: one dataclass, carried to the server process as
JSON in $SCALELAB_GENERATE_SETTINGS (the API key travels apart: generate.auth)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.trace import TraceConfig
from scalelab.system.generate.engine import LlmEngineConfig

SETTINGS_ENV = "SCALELAB_GENERATE_SETTINGS"


@dataclass(kw_only=True)
class ApiSettings:
    """Everything `scalelab generate serve` configures (travels to uvicorn as JSON)."""

    model: str = "smollm2-135m"
    """smollm2-135m, tiny, or a Llama .gguf path."""
    engine: dict[str, Any] = field(default_factory=dict)
    """LlmEngineConfig fields (kv_cache_bytes, block_size, max_num_seqs, ...)."""
    max_waiting: int = 64
    """Requests held beyond the running batch; the next one gets 429."""
    max_prompt_tokens: int | None = None
    """Longest prompt accepted (default: max_model_len - 1)."""
    max_output_tokens: int = 1024
    """Largest max_tokens accepted."""
    default_max_tokens: int = 16
    """max_tokens when a completion request gives none (OpenAI's default)."""
    default_chat_max_tokens: int = 256
    """max_tokens when a chat request gives none."""
    request_timeout_s: float = 120.0
    """Deadline from arrival; then the request is dropped (504, or an error event mid-stream)."""
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    torch_threads: int | None = None
    seed: int = 0
    """Seed of the tiny model's weights."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """Request tracing (web.trace): admission, queue, prefill, decode spans per request."""
    governance_file: str | None = None
    """Rate limits, budgets (tokens reported per request) and kill switches (web.governance);
    None = no governance layer."""

    def __post_init__(self) -> None:
        if self.max_waiting < 0 or self.max_output_tokens < 1 or self.request_timeout_s <= 0:
            raise BadUsageError("max_waiting >= 0, max_output_tokens >= 1, timeout > 0 needed")
        self.trace = TraceConfig.of(self.trace)  # a dict when it came through JSON
        LlmEngineConfig(**self.engine)  # fail here, in the CLI, not in the server process

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ApiSettings:
        return cls(**json.loads(text))
