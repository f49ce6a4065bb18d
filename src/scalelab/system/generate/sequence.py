"""One request's state inside the engine: its tokens, sampling settings, blocks and clocks."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from scalelab.lab.core.errors import BadInputError


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


MAX_LOGPROBS = 20
"""Most alternatives per position a request may ask for (vLLM's default max_logprobs)."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One output token's log-probability under the model (raw logits, before temperature and
    top-p, as vLLM reports them) and the most likely tokens at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token id, log-probability), most likely first."""


@dataclass(kw_only=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops (OpenAI's fields)."""

    max_tokens: int = 16
    """Most tokens to generate."""
    temperature: float = 0.0
    """0 is greedy (argmax); above 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    seed: int | None = None
    """Seeds this request's own generator, so a sampled output repeats exactly."""
    stop: tuple[str, ...] = ()
    """Generation ends before the first of these strings; the string is not returned."""
    ignore_eos: bool = False
    """Keep going past end-of-sequence tokens (benchmarks with fixed output lengths)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already in the output (OpenAI's, -2..2)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it is already in the output (-2..2)."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Added to those tokens' logits before choosing (OpenAI's, -100..100)."""
    logprobs: int | None = None
    """Record each output token's log-probability and those of the `logprobs` most likely
    tokens at its position (0: the chosen token's only; None: nothing, no cost)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise BadInputError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 10.0:
            raise BadInputError(f"temperature must be in [0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise BadInputError("stop strings must be non-empty")
        if not (-2.0 <= self.presence_penalty <= 2.0 and -2.0 <= self.frequency_penalty <= 2.0):
            raise BadInputError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if any(not -100.0 <= b <= 100.0 for b in self.logit_bias.values()):
            raise BadInputError("logit_bias values must be in [-100, 100]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise BadInputError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Penalties or a bias change the logits before the choice (no draft verification:
        a draft is checked against the unadjusted argmax)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """token_ids holds prompt + output; the KV of token_ids[:num_computed] is in the cache."""

    prompt_ids: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(_ids))
    token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    """Tokens whose keys and values are in the cache (prefix-cache hits included)."""
    num_hashed_blocks: int = 0
    """Leading full blocks already registered in the prefix cache."""
    arrival: float = field(default_factory=time.perf_counter)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    """'stop' (EOS or a stop string), 'length' (max_tokens or context), 'abort'."""
    preemptions: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens found in the prefix cache at the last admission."""
    text: str = ""
    """Output text so far (stop strings cut off)."""
    sent_chars: int = 0
    """Characters of `text` already handed to the caller."""
    detok_prefix: int = 0
    detok_read: int = 0
    """Incremental detokenization's offsets into the output ids (TextTokenizer.decode_next)."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per output token when params.logprobs is set (the EOS that ended it excluded)."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise BadInputError("the prompt is empty; send at least one token")
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        """Its next step computes more than the one newest token (prompt, or recompute)."""
        return self.num_computed < len(self.token_ids) - 1

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED
