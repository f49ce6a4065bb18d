"""Token log-probabilities in the two shapes OpenAI's API returns them.

Completions: parallel lists `tokens`, `token_logprobs`, `top_logprobs` (one {token: logprob} map
per position) and `text_offset` (where each token's text starts in the generated text). Chat:
`content`, one entry per token with its `bytes` and its `top_logprobs`. A token's text is its
bytes decoded with replacement (a byte-level token may hold part of a character); `bytes` is
exact; vLLM's `return_tokens_as_token_ids` writes "token_id:<id>" instead. Tokens generated
after a stop string are listed although their text was cut off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scalelab.system.generate.sequence import TokenLogprob
from scalelab.system.generate.tokenizer import TextTokenizer


def _text(tok: TextTokenizer, token_id: int, as_ids: bool) -> str:
    if as_ids:  # vLLM's return_tokens_as_token_ids: exact where text is lossy
        return f"token_id:{token_id}"
    return tok.token_bytes(token_id).decode("utf-8", errors="replace")


def completion_logprobs(tok: TextTokenizer, entries: Sequence[TokenLogprob],
                        offset: int = 0, *, as_ids: bool = False) -> dict[str, Any]:
    """The `logprobs` object of a completion choice; `offset` is where the first token's text
    starts (a stream's later chunks continue from the earlier ones)."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        t = _text(tok, e.token_id, as_ids)
        tokens.append(t)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_text(tok, i, as_ids): lp for i, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(tok: TextTokenizer, entries: Sequence[TokenLogprob], *,
                  as_ids: bool = False) -> dict[str, Any]:
    """The `logprobs` object of a chat choice (`top_logprobs` empty when none were asked)."""

    def one(token_id: int, lp: float) -> dict[str, Any]:
        return {"token": _text(tok, token_id, as_ids), "logprob": lp,
                "bytes": list(tok.token_bytes(token_id))}

    return {"content": [{**one(e.token_id, e.logprob),
                         "top_logprobs": [one(i, lp) for i, lp in e.top]} for e in entries],
            "refusal": None}
