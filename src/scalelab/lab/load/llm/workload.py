"""A seeded workload for OpenAI-compatible streaming endpoints: prompt and output lengths.

A workload is the request mix a generation load test offers: how long each prompt is, how many
tokens each answer may have, whether they share a prefix (a system prompt, which a prefix cache
can reuse), and which API is spoken (`/v1/chat/completions` or `/v1/completions`). Lengths come
from a distribution ("fixed:128", "uniform:64,256", "normal:128,32") or, for prompts, from a
file of real prompts. Everything is drawn from one seed, so two runs offer the same bytes.

Prompt lengths are in words from a small vocabulary of common English words, which every
subword tokenizer we know maps to about one token each (plus the leading space): the server's
own `usage.prompt_tokens` is what the results report, the word count is only the request.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.llm.dataset import Dataset
from scalelab.lab.load.send import Target, build_request

Api = Literal["chat", "completions"]
APIS: tuple[Api, ...] = ("chat", "completions")
PATHS: dict[Api, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
UsageMode = Literal["continuous", "final", "none"]
USAGE_MODES: tuple[UsageMode, ...] = ("continuous", "final", "none")
MAX_DISTINCT = 100_000
"""Most distinct requests built for one run (they are reused round-robin)."""

# Short, common words: one token each in GPT-2/Llama/SmolLM-style BPE vocabularies.
WORDS = _WORDS = tuple(str.split(
    "the of and to in is it you that he was for on are with as his they be at one have "
          "this from or had by hot word but what some we can out other were all there when up "
          "use your how said an each she which do their time if will way about many then them "
          "write would like so these her long make thing see him two has look more day could go "
          "come did number sound no most people my over know water than call first who may down "
          "side been now find any new work part take get place made live where after back little "
          "only round man year came show every good me give our under name very through just "
          "form great think say help low line turn cause much mean before move right boy old too "
          "same tell does set three want air well also play small end put home read hand port "
          "large spell add even land here must big high such follow act why ask men change went "
          "light kind off need house picture try us again animal point mother world near build "
          "self earth father head stand own page should country found answer school grow study "
          "still learn plant cover food sun four thought let keep eye never last door between "
          "city tree cross since hard start might story saw far sea draw left late run while "
          "press close night real life few stop"))
_DIST = re.compile(r"^\s*(fixed|uniform|normal)\s*:\s*([^,]+?)\s*(?:,\s*(.+?))?\s*$")


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """A distribution of lengths (tokens or words), parsed from "fixed:N", "uniform:A,B" or
    "normal:MEAN,SD" (normal is rounded and clipped to [1, 4×mean])."""

    kind: Literal["fixed", "uniform", "normal"]
    """Which family."""
    a: float
    """fixed: the length; uniform: the low end; normal: the mean."""
    b: float = 0.0
    """uniform: the high end (inclusive); normal: the standard deviation."""

    @classmethod
    def parse(cls, text: str | int, *, what: str) -> LengthDist:
        if isinstance(text, int) or str(text).strip().isdigit():
            return cls(kind="fixed", a=float(int(text)))._checked(what)
        m = _DIST.match(str(text))
        if not m:
            raise BadUsageError(f"{what}: {text!r} is not a length distribution; write e.g. "
                                "fixed:128, uniform:64,256 or normal:128,32")
        kind = m.group(1)
        try:
            a = float(m.group(2))
            b = float(m.group(3)) if m.group(3) is not None else 0.0
        except ValueError:
            raise BadUsageError(f"{what}: {text!r} has a non-number; write e.g. uniform:64,256") \
                from None
        if kind != "fixed" and m.group(3) is None:
            raise BadUsageError(f"{what}: {kind} needs two numbers, e.g. {kind}:64,256")
        return cls(kind=kind, a=a, b=b)._checked(what)  # type: ignore[arg-type]

    def _checked(self, what: str) -> LengthDist:
        if not (math.isfinite(self.a) and math.isfinite(self.b)) or self.a < 1:
            raise BadUsageError(f"{what}: lengths must be at least 1, got {self.label}")
        if self.kind == "uniform" and self.b < self.a:
            raise BadUsageError(f"{what}: uniform:{self.a:g},{self.b:g} has high < low")
        if self.kind == "normal" and self.b < 0:
            raise BadUsageError(f"{what}: the standard deviation must be >= 0")
        return self

    @property
    def label(self) -> str:
        return f"fixed:{self.a:g}" if self.kind == "fixed" else f"{self.kind}:{self.a:g},{self.b:g}"

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2.0 if self.kind == "uniform" else self.a

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` integer lengths >= 1."""
        if self.kind == "fixed":
            return np.full(n, round(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(round(self.a), round(self.b) + 1, size=n)
        v = np.rint(rng.normal(self.a, self.b, size=n))
        return np.clip(v, 1, max(1, int(4 * self.a))).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What each streaming request asks for; `build` turns it into request bytes."""

    api: Api = "chat"
    """chat: /v1/chat/completions with messages; completions: /v1/completions with a prompt."""
    model: str = "default"
    """The `model` field (servers with one model usually ignore it)."""
    prompt: LengthDist = field(default_factory=lambda: LengthDist(kind="fixed", a=128))
    """Prompt length in words (≈ tokens), unless `prompts_file` is given."""
    output: LengthDist = field(default_factory=lambda: LengthDist(kind="fixed", a=64))
    """Output length: each request's `max_tokens`."""
    prompts_file: Path | None = None
    """A file of real prompts: JSON Lines with "prompt" (or "text"), or plain text, one a line."""
    shared_prefix_words: int = 0
    """Words of a system prompt every request starts with (what a prefix cache reuses)."""
    ignore_eos: bool = True
    """Send vLLM's `ignore_eos` so every answer runs to `max_tokens` (others ignore it)."""
    usage: UsageMode = "continuous"
    """continuous: ask for usage in every chunk (vLLM's continuous_usage_stats) so tokens per
    chunk are exact; final: only the OpenAI-standard final usage chunk; none: neither."""
    seed: int = 0
    """Seed of every draw."""
    temperature: float = 0.0
    """Sampling temperature sent with every request; 0 is greedy (deterministic, and what the
    greedy-agreement quality probe needs)."""
    distinct: int = 256
    """Distinct requests to build (used round-robin; more costs memory, not accuracy)."""
    dataset: Dataset | None = None
    """Requests from a dataset (dataset.py): their own messages and max_tokens, in place of
    `prompt`, `output` and `prompts_file`."""

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise BadUsageError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.usage not in USAGE_MODES:
            raise BadUsageError(f"--usage must be one of {', '.join(USAGE_MODES)}")
        if self.shared_prefix_words < 0:
            raise BadUsageError("--shared-prefix must be >= 0 words")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise BadUsageError(f"--temperature must lie in [0, 2], got {self.temperature}")
        if not (1 <= self.distinct <= MAX_DISTINCT):
            raise BadUsageError(f"--distinct must be in [1, {MAX_DISTINCT}], got {self.distinct}")

    @property
    def path(self) -> str:
        return PATHS[self.api]

    def label(self) -> str:
        if self.dataset is not None:
            pre = f", prefix {self.shared_prefix_words}" if self.shared_prefix_words else ""
            return f"{self.api}, {self.dataset.label()}{pre}"
        src = f"file:{self.prompts_file.name}" if self.prompts_file else self.prompt.label
        pre = f", prefix {self.shared_prefix_words}" if self.shared_prefix_words else ""
        return f"{self.api}, prompt {src}{pre}, output {self.output.label}"

    def bodies(self) -> list[tuple[dict[str, object], int, int]]:
        """(JSON body, prompt words, max_tokens) for each distinct request."""
        rng = np.random.default_rng(self.seed)
        words = np.array(_WORDS)
        prefix = " ".join(rng.choice(words, size=self.shared_prefix_words).tolist()) \
            if self.shared_prefix_words else ""
        if self.dataset is not None:
            reqs = self.dataset.requests
            # A replayed trace's row i is send i: one body per row, in order (the generator
            # takes bodies in rotation, in the order it sends).
            n = max(self.distinct, len(reqs)) if self.dataset.ordered else self.distinct
            return [self._body(prefix, r.messages, r.output_len, r.prompt_len)
                    for r in (reqs[i % len(reqs)] for i in range(n))]
        if self.prompts_file is not None:
            texts = read_prompts(self.prompts_file)
            idx = rng.integers(0, len(texts), size=self.distinct)
            prompts = [texts[i] for i in idx.tolist()]
        else:
            lens = self.prompt.sample(rng, self.distinct)
            prompts = [" ".join(rng.choice(words, size=int(n)).tolist()) for n in lens.tolist()]
        outs = self.output.sample(rng, self.distinct)
        return [self._body(prefix, [{"role": "user", "content": text}], int(mt),
                           len(text.split()))
                for text, mt in zip(prompts, outs.tolist(), strict=True)]

    def _body(self, prefix: str, messages: list[dict[str, str]], max_tokens: int,
              length: int) -> tuple[dict[str, object], int, int]:
        """(JSON body, prompt length with the prefix, max_tokens) of one request."""
        body: dict[str, object] = {"model": self.model, "stream": True, "max_tokens": max_tokens,
                                   "temperature": self.temperature}
        if self.api == "chat":
            msgs = [{"role": "system", "content": prefix}] if prefix else []
            body["messages"] = [*msgs, *messages]
        else:
            text = "\n".join(m["content"] for m in messages)
            body["prompt"] = f"{prefix}\n{text}" if prefix else text
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.usage != "none":
            so: dict[str, bool] = {"include_usage": True}
            if self.usage == "continuous":
                so["continuous_usage_stats"] = True
            body["stream_options"] = so
        return body, length + self.shared_prefix_words, max_tokens

    def build(self, target: Target) -> list[bytes]:
        """The encoded HTTP requests, one per distinct body."""
        return [build_request(target, method="POST", path=self.path,
                              body=json.dumps(b, separators=(",", ":")).encode(),
                              headers={"Accept": "text/event-stream"})
                for b, _, _ in self.bodies()]


def read_prompts(path: Path) -> list[str]:
    """Prompts from JSON Lines ("prompt" or "text" per line) or plain text (one per line)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"--prompts {path}: cannot read it ({e.strerror})") from e
    out: list[str] = []
    for n, line in enumerate(raw.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as e:
                raise BadInputError(f"--prompts {path}:{n}: not JSON ({e.msg}); write one "
                                    "{\"prompt\": \"...\"} per line or plain text") from None
            text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
            if not isinstance(text, str) or not text:
                raise BadInputError(f"--prompts {path}:{n}: no \"prompt\" or \"text\" string")
            out.append(text)
        else:
            out.append(s)
    if not out:
        raise BadInputError(f"--prompts {path}: no prompts in it")
    return out
