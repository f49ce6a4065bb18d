"""vLLM's endpoints beside generation: /tokenize, /detokenize and /version.

/tokenize takes a `prompt` (BOS prepended by default, as for /v1/completions) or `messages`
(rendered by the chat template, no BOS of our own, as for /v1/chat/completions), so a client
counts exactly the tokens a request will cost; the answer is vLLM's: `count`, `max_model_len`,
`tokens` and, when asked, `token_strs`. /detokenize turns ids back into text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

import scalelab
from scalelab.generate.protocol import DetokenizeRequest, FieldError, TokenizeRequest

if TYPE_CHECKING:
    from scalelab.generate.api import Service


def add_endpoints(app: FastAPI, svc: Service) -> None:
    tok = svc.engine.tokenizer

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        svc.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise FieldError("prompt", "send either prompt or messages (one of them)")
        if body.messages is not None:
            if not body.messages:
                raise FieldError("messages", "messages is empty")
            msgs = [m.for_template(f"messages.{i}") for i, m in enumerate(body.messages)]
            ids = svc.chat_ids(msgs, body.add_generation_prompt, body.chat_template_kwargs,
                               add_special_tokens=bool(body.add_special_tokens))
        else:
            assert body.prompt is not None
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = tok.encode(body.prompt, add_special_tokens=add)
        strs = ([tok.token_bytes(i).decode("utf-8", errors="replace") for i in ids]
                if body.return_token_strs else None)
        return {"count": len(ids), "max_model_len": svc.engine.cfg.max_model_len,
                "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        svc.check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < tok.vocab_size]
        if bad:
            raise FieldError("tokens", f"token ids must lie in [0, {tok.vocab_size}); got "
                             f"{bad[:5]}")
        return {"prompt": tok.decode(body.tokens)}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": scalelab.__version__}
