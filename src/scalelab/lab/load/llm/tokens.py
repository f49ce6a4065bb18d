"""Per-request token timings from a stream's chunks: TTFT, every inter-token gap, TPOT, e2e.

A streamed answer arrives as SSE events, and one event may carry several tokens (servers batch
tokens per chunk under load, speculative decoding emits several at once, detokenizers hold back
partial characters). Counting one token per chunk, as several load testers did (vLLM issue
27485), undercounts output tokens and turns k gaps of g/k into one gap of g, so ITL looks worse
and tokens/s better-or-worse depending on the chunking. Tokens per event come, best first, from:

1. `continuous` usage: the server reports cumulative completion_tokens in every chunk (vLLM's
   `stream_options.continuous_usage_stats`), so an event's tokens are the difference: exact.
2. `final` usage: only the total at the end (the OpenAI standard); the total is split across
   the events in proportion to their characters (largest remainder, so it sums exactly).
   Exact when every event carries one token; an estimate otherwise.
3. `tokenizer`: no usage, and the model's tokenizer given (`--tokenizer`): the streamed text is
   counted with it and the count split across events by characters as in 2. The total is the
   tokenizer's count of the decoded text, which equals the server's where detokenising and
   re-tokenising round-trip (an estimate otherwise: the results say which was used).
4. `chunks`: no usage and no tokenizer: one token per event, an estimate (an undercount where
   an event carries several), said so in the results.

Gaps: an event of k tokens arriving g after the previous one contributes k gaps of g/k; the
first event's extra k-1 tokens arrived with the first one (gaps of 0). So the gaps sum to
(last token - first token) and there are exactly output_tokens - 1 of them, and their mean is
TPOT = (e2e - TTFT) / (output_tokens - 1) whenever the stream ends with its last token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

TokenSource = Literal["usage-continuous", "usage-final", "tokenizer", "chunks"]


@dataclass(frozen=True, slots=True)
class Event:
    """One parsed SSE data event of an OpenAI-style stream."""

    text_chars: int
    """Characters of generated text in it (delta.content or text, all choices)."""
    completion_tokens: int | None
    """Cumulative usage.completion_tokens when the event carries usage."""
    prompt_tokens: int | None
    """usage.prompt_tokens when the event carries usage."""
    finished: bool
    """A choice carried a finish_reason."""
    error: str | None
    """The server sent an error object instead of a chunk."""
    text: str = ""
    """The generated text itself (all choices), for the greedy-agreement probe."""


def parse_event(data: bytes) -> Event | None:
    """Parse one `data:` payload; None for `[DONE]`. Raises ValueError on a non-JSON payload.

    The chunk shapes servers stream, each read for its text, its end and its token counts:
    - OpenAI chat (vLLM, SGLang, TGI's /v1, llama.cpp's /v1, ours): `choices[].delta.content`
      (and `reasoning_content` / `reasoning` of reasoning models), `finish_reason`, `usage`;
    - OpenAI completions: `choices[].text`;
    - TGI's own /generate_stream: `token.text` (a special token carries none), the end as a
      non-null `generated_text`, the total in `details.generated_tokens`;
    - llama.cpp's own /completion: `content`, `stop: true` at the end, the totals in
      `tokens_predicted` / `tokens_evaluated`; its last OpenAI chunk may carry only
      `timings.predicted_n` / `prompt_n`, read as the final usage.
    """
    if data.strip() == b"[DONE]":
        return None
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("event is not a JSON object")
    if "error" in obj and "choices" not in obj and obj["error"]:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        return Event(0, None, None, False, str(msg)[:200])
    parts: list[str] = []
    finished = False
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if isinstance(delta, dict):
            for key in ("reasoning_content", "reasoning", "content"):
                piece = delta.get(key)
                if isinstance(piece, str):
                    parts.append(piece)
        elif isinstance(ch.get("text"), str):
            parts.append(ch["text"])
        if ch.get("finish_reason"):
            finished = True
    ct, pt = _usage(obj)
    tok = obj.get("token")
    if isinstance(tok, dict):  # TGI /generate_stream
        if isinstance(tok.get("text"), str) and not tok.get("special"):
            parts.append(tok["text"])
        details = obj.get("details")
        if obj.get("generated_text") is not None:
            finished = True
        if isinstance(details, dict):
            finished = finished or bool(details.get("finish_reason"))
            ct = _int(details.get("generated_tokens"), ct)
    elif "choices" not in obj and isinstance(obj.get("content"), str):  # llama.cpp /completion
        parts.append(obj["content"])
        finished = bool(obj.get("stop"))
        if finished:
            ct = _int(obj.get("tokens_predicted"), ct)
            pt = _int(obj.get("tokens_evaluated"), pt)
    text = "".join(parts)
    return Event(len(text), ct, pt, finished, None, text)


def _int(v: Any, default: int | None) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def _usage(obj: dict[str, Any]) -> tuple[int | None, int | None]:
    """(completion, prompt) tokens from `usage`, else from llama.cpp's `timings`."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        return _int(usage.get("completion_tokens"), None), _int(usage.get("prompt_tokens"), None)
    timings = obj.get("timings")
    if isinstance(timings, dict) and obj.get("choices") is not None:
        return _int(timings.get("predicted_n"), None), _int(timings.get("prompt_n"), None)
    return None, None


def tokens_per_event(events: list[Event], count: Callable[[str], int] | None = None
                     ) -> tuple[list[int], TokenSource, int | None]:
    """Tokens each event carried, how that was known, and the prompt tokens (if reported);
    `count` (the model's tokenizer, text -> tokens) counts a stream that reports no usage.

    Events without text and without a usage increase (the role-only first chunk, a final
    usage-only chunk) carry 0 tokens.
    """
    prompt = next((e.prompt_tokens for e in reversed(events) if e.prompt_tokens is not None),
                  None)
    with_text = [e.text_chars > 0 for e in events]
    cum = [e.completion_tokens for e in events]
    text_cum = [c for c, t in zip(cum, with_text, strict=True) if t]
    if text_cum and all(c is not None for c in text_cum):
        out: list[int] = []
        prev = 0
        for c in cum:
            if c is None:
                out.append(0)
                continue
            out.append(max(0, c - prev))
            prev = max(prev, c)
        return out, "usage-continuous", prompt
    total = next((c for c in reversed(cum) if c is not None), None)
    chars = [e.text_chars for e in events]
    if total is not None:
        return split_proportional(total, chars), "usage-final", prompt
    if count is not None and any(with_text):
        return split_proportional(count("".join(e.text for e in events)), chars), \
            "tokenizer", prompt
    return [1 if t else 0 for t in with_text], "chunks", prompt


def split_proportional(total: int, weights: list[int]) -> list[int]:
    """Split `total` into integers proportional to `weights` (largest remainder; exact sum).

    Then every event with a positive weight gets at least one token while the total allows
    (taken from the largest share), because an event that carried text carried a token.
    """
    n_pos = sum(1 for w in weights if w > 0)
    if total <= 0 or n_pos == 0:
        return [0] * len(weights)
    wsum = sum(weights)
    shares = [total * w / wsum for w in weights]
    out = [int(x) for x in shares]
    left = total - sum(out)
    order = sorted(range(len(weights)), key=lambda i: (-(shares[i] - int(shares[i])), i))
    for i in order[:left]:
        out[i] += 1
    if total >= n_pos:
        for i, w in enumerate(weights):
            if w > 0 and out[i] == 0:
                out[max(range(len(out)), key=lambda j: out[j])] -= 1
                out[i] = 1
    return out


@dataclass(frozen=True, slots=True)
class Timing:
    """One successful request's token timings (seconds)."""

    ttft_s: float
    """First token's arrival minus the request's start (due time in open loop)."""
    e2e_s: float
    """End of the stream minus the start."""
    output_tokens: int
    """Tokens generated."""
    gaps_s: list[float]
    """Every inter-token gap (output_tokens - 1 of them)."""
    tpot_s: float | None
    """(e2e - TTFT) / (output_tokens - 1); None for a one-token answer."""


def timing(start: float, times: list[float], tokens: list[int], end: float) -> Timing | None:
    """Timings from event arrival `times` and `tokens` per event; None when no token came."""
    first = next((i for i, k in enumerate(tokens) if k > 0), None)
    if first is None:
        return None
    t_first = times[first]
    gaps: list[float] = [0.0] * (tokens[first] - 1)
    prev = t_first
    for t, k in zip(times[first + 1:], tokens[first + 1:], strict=True):
        if k <= 0:
            continue
        g = (t - prev) / k
        gaps.extend([g] * k)
        prev = t
    out = sum(tokens)
    ttft = t_first - start
    e2e = max(end, prev) - start
    tpot = (e2e - ttft) / (out - 1) if out > 1 else None
    return Timing(ttft_s=ttft, e2e_s=e2e, output_tokens=out, gaps_s=gaps, tpot_s=tpot)
