"""A model's serving config (REPO/<model>/config.json) and the version policy.

These are pydantic models because they sit at a boundary (a JSON file a person writes); a bad
field is reported with its path, e.g. `dynamic_batching.max_queue_size: must be >= 1`. Part of
the model-repository layout this shared layer defines: the server reads it, the lab's serve
stage writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.strict import StrictFrozenModel
from scalelab.layers.nets.repository import CONFIG_FILE, read_json

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                   "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"]
TOKENIZER_FILE = "tokenizer.json"
"""A text model's tokenizer, in each version directory (the `tokenizers` library's format)."""


class TensorSpec(StrictFrozenModel):
    """One input or output: its name, OIP datatype and shape (-1 = any size, first = batch)."""

    name: str = Field(min_length=1, max_length=128)
    datatype: Datatype
    shape: list[int] = Field(min_length=1)

    @model_validator(mode="after")
    def _dims(self) -> TensorSpec:
        if any(d == 0 or d < -1 for d in self.shape):
            raise ValueError(f"shape {self.shape}: each dimension is -1 (any) or >= 1")
        return self


class DynamicBatching(StrictFrozenModel):
    """How requests for one model version are grouped before the forward pass."""

    max_queue_delay_ms: float = Field(default=2.0, ge=0, le=10_000)
    """How long the oldest queued request may wait for others to join its batch."""
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    """Batch sizes (rows) dispatched as soon as they can be formed; others wait for the delay."""
    max_queue_size: int = Field(default=256, ge=1, le=1_000_000)
    """Requests waiting per version; when full the server answers 429 with Retry-After."""
    default_timeout_ms: float = Field(default=1000.0, gt=0, le=3_600_000)
    """Deadline when the request sends no X-Request-Timeout-Ms header."""
    dispatch_when_idle: bool = True
    """Dispatch a batch before max_queue_delay_ms once no further request is on its way
    through the server (the event loop ran a few turns and none reached the queue). Why: the
    delay buys company only while requests arrive; a closed-loop client, or a quiet minute,
    would pay it on every request for nothing. False = Triton's rule, the full delay."""


class VersionPolicy(StrictFrozenModel):
    """Which versions on disk are loaded: exactly one of latest / all / specific."""

    latest: dict[Literal["num_versions"], int] | None = None
    all: dict[str, object] | None = None
    specific: dict[Literal["versions"], list[int]] | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        given = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of latest / all / specific, not {' and '.join(given)}")
        if self.latest is not None and self.latest.get("num_versions", 1) < 1:
            raise ValueError("latest.num_versions must be >= 1")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions to load out of `available` (pure; sorted ascending)."""
        avail = sorted(set(available))
        if self.all is not None:
            return avail
        if self.specific is not None:
            want = set(self.specific.get("versions", []))
            return [v for v in avail if v in want]
        n = (self.latest or {}).get("num_versions", 1)
        return avail[-n:]


class CacheConfig(StrictFrozenModel):
    """Optional response cache for this model (off unless enabled)."""

    enabled: bool = False
    max_entries: int = Field(default=10_000, ge=1)
    ttl_s: float = Field(default=60.0, gt=0)
    coalesce: bool = True
    """Identical concurrent requests share one computation (costs one SHA-256 per request)."""


class TokenizerConfig(StrictFrozenModel):
    """A text model: its one BYTES input is tokenized in the server (by the version's
    tokenizer.json), and the network receives input_ids and attention_mask, INT64
    [batch, max_tokens]. Why in the server: clients send text, and a client-side tokenizer
    that drifts from the model's own silently changes the answers."""

    max_tokens: int = Field(default=128, ge=1, le=8192)
    """Every text is truncated or padded to this many tokens (the network's fixed width)."""


class ModelConfig(StrictFrozenModel):
    """REPO/<model>/config.json: inputs, outputs, batching, version policy, cache."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str
    platform: str = "scalelab-torch"
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    max_batch_size: int = Field(default=64, ge=1, le=65_536)
    dynamic_batching: DynamicBatching = Field(default_factory=DynamicBatching)
    version_policy: VersionPolicy = Field(
        default_factory=lambda: VersionPolicy(latest={"num_versions": 1}))
    cache: CacheConfig = Field(default_factory=CacheConfig)
    tokenizer: TokenizerConfig | None = None
    """Set for a text model (one BYTES input, tokenized in the server); None otherwise."""
    inline_below_ms: float = Field(default=1.0, ge=0, le=1000)
    """Run a batch's forward pass on the event loop itself, not the version's thread, while
    batches take less than this much CPU and less than 10x this in wall time (recent averages;
    0 = always the thread). Why: handing a batch to the thread and its result back costs two
    wake-ups and GIL hand-offs, more than a tiny MLP's forward; a slow model — or one that
    waits, on a sleep, I/O or a device — stays on its thread so the loop keeps accepting while
    it computes. Costs: the loop answers nothing for that long."""
    trace: bool | None = None
    """Run the network as a TorchScript trace (one GIL release per forward instead of one per
    op, 2-3x faster beside a busy event loop). None = only for architectures known to be
    trace-safe; a trace freezes data-dependent branches and drops Python side effects."""
    runtime: Literal["auto", "torch", "onnxruntime"] = "auto"
    """What runs a torch version's network. auto: ONNX Runtime for architectures known to be
    trace-safe when onnx and onnxruntime are installed and the exported graph agrees with torch
    on check batches, else torch; torch: always torch (traced per `trace`); onnxruntime:
    always, and the version is unavailable (with the reason) when it cannot be exported or
    disagrees. Why: one native call a batch instead of torch's dispatch per op — the server's
    CPU per 1-row request fell from 129 to 104 us on the benchmark MLP (docs/serve.md).
    Versions stored as ONNX run on it anyway."""

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names repeat: {names}")
        bad = [t.name for t in self.inputs if t.shape[0] != -1]
        if bad:
            raise ValueError(f"inputs {bad}: the first dimension is the batch and must be -1")
        text = [t.name for t in self.inputs if t.datatype == "BYTES"]
        if self.tokenizer is not None and (len(self.inputs) != 1 or not text):
            raise ValueError("a model with a tokenizer takes exactly one input, of datatype "
                             "BYTES (the text)")
        if text and self.tokenizer is None:
            raise ValueError(f"inputs {text} are BYTES: add \"tokenizer\": {{\"max_tokens\": "
                             "N}} (and tokenizer.json in each version) so the server tokenizes "
                             "them")
        if text and self.inputs[0].shape not in ([-1], [-1, 1]):
            raise ValueError(f"input '{text[0]}': a text input is one string per row, shape "
                             "[-1] or [-1, 1]")
        bytes_out = [t.name for t in self.outputs if t.datatype == "BYTES"]
        if bytes_out:
            raise ValueError(f"outputs {bytes_out}: this server computes numbers "
                             "(logits, probabilities, label); BYTES outputs are not supported")
        pref = self.dynamic_batching.preferred_batch_sizes
        if any(p < 1 or p > self.max_batch_size for p in pref):
            raise ValueError(f"preferred_batch_sizes {pref} must lie in [1, max_batch_size]")
        return self

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def network_inputs(self) -> list[TensorSpec]:
        """What the network takes: the inputs, or a text model's token ids and mask."""
        if self.tokenizer is None:
            return list(self.inputs)
        shape = [-1, self.tokenizer.max_tokens]
        return [TensorSpec(name="input_ids", datatype="INT64", shape=shape),
                TensorSpec(name="attention_mask", datatype="INT64", shape=shape)]


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{loc}: {err['msg']}"


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read and validate REPO/<model>/config.json; the name must match the directory."""
    path = model_dir / CONFIG_FILE
    raw = read_json(path)
    raw.setdefault("name", model_dir.name)
    try:
        cfg = ModelConfig.model_validate(raw)
    except ValidationError as e:
        raise BadInputError(f"{path}: {_first_error(e)}; fix the field and reload") from None
    if cfg.name != model_dir.name:
        raise BadInputError(
            f"{path}: name {cfg.name!r} differs from its directory {model_dir.name!r}; "
            "make them equal"
        )
    return cfg
