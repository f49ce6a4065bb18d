"""Text <-> token ids, and the chat template that turns messages into one prompt.

Two sources, one class: a GGUF file's BPE vocabulary (the real model) and a byte-level
vocabulary built in code (the tiny test model), both run by the `tokenizers` library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, the template SmolLM2 uses (without its default system message)."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are spelt in."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


@dataclass(kw_only=True)
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus what generation needs around it."""

    vocab: list[str]
    """Token strings by id (byte-level spelling)."""
    merges: list[tuple[str, str]]
    """BPE merges in priority order (empty: every byte is its own token)."""
    special: list[str]
    """Control tokens matched whole in text and never split (`<|im_end|>`, ...)."""
    eos_ids: frozenset[int]
    """Ids that end a generation."""
    bos_id: int | None = None
    """Prepended to every prompt when set."""
    chat_template: str = CHATML_TEMPLATE
    """Jinja template over `messages` and `add_generation_prompt` (Hugging Face's convention)."""
    split_digits: bool = True
    """Each digit is its own pre-token (SmolLM's `smollm` pre-tokenizer)."""
    bos_token: str | None = None
    """The beginning-of-sequence token's text, which chat templates see as `bos_token` (set
    even when `bos_id` is None: a template may write it itself)."""
    eos_token: str | None = None
    """The end-of-sequence token's text (`eos_token` in chat templates)."""

    @cached_property
    def _tok(self):  # type: ignore[no-untyped-def]
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        index = {t: i for i, t in enumerate(self.vocab)}
        tk = Tokenizer(models.BPE(vocab=index, merges=self.merges, fuse_unk=False))
        steps: list[Any] = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if self.split_digits:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in self.special])
        return tk

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` prepends `bos_id` when the model has one
        (off for a rendered chat, whose template writes its own `bos_token`, as transformers
        and vLLM tokenize chats)."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.bos_id is not None:
            return [self.bos_id, *ids]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a control token: its UTF-8 text). Byte-level BPE
        spells bytes as printable characters; a token may hold part of a character. An id
        past the vocabulary (a model's embedding table may be padded beyond it) is empty."""
        if not 0 <= token_id < len(self.vocab):
            return b""
        text = self.vocab[token_id]
        if text in self._special_set:
            return text.encode()
        inverse = self._byte_of
        if all(c in inverse for c in text):
            return bytes(inverse[c] for c in text)
        return text.encode()

    @cached_property
    def _special_set(self) -> frozenset[str]:
        return frozenset(self.special)

    @cached_property
    def _byte_of(self) -> dict[str, int]:
        return {c: b for b, c in bytes_to_unicode().items()}

    def decode(self, ids: Sequence[int]) -> str:
        # Control tokens are dropped from user-visible text (an EOS never reaches here anyway).
        text: str = self._tok.decode(list(ids), skip_special_tokens=True)
        return text

    def decode_next(self, ids: Sequence[int], prefix_offset: int, read_offset: int, *,
                    final: bool = False) -> tuple[str, int, int]:
        """The text `ids[read_offset:]` adds, decoding only from `prefix_offset` (vLLM's
        incremental detokenization): (new text, prefix_offset, read_offset) to pass next time.

        Decoding the whole output every step costs O(length) a step, O(length²) a sequence;
        this decodes the tokens since the last emission and the window before them. Text ending
        in U+FFFD (a character whose bytes have not all arrived) is held back until they have —
        or, with `final`, handed out as the full decode would. Concatenated over a sequence, the
        pieces equal `decode(ids)` (tested on byte-split characters)."""
        prefix = self.decode(ids[prefix_offset:read_offset])
        full = self.decode(ids[prefix_offset:])
        if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
            return full[len(prefix):], read_offset, len(ids)
        return "", prefix_offset, read_offset

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                    add_generation_prompt: bool = True,
                    kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text for a chat (by default ending with the assistant's turn opened),
        rendered as transformers' `apply_chat_template` renders it (generate.template)."""
        from scalelab.system.generate.template import render

        special = {k: v for k, v in (("bos_token", self.bos_token),
                                     ("eos_token", self.eos_token)) if v is not None}
        return render(self.chat_template, messages, special_tokens=special,
                      add_generation_prompt=add_generation_prompt, kwargs=kwargs)


def byte_tokenizer() -> TextTokenizer:
    """256 byte tokens, then <|endoftext|>, <|im_start|>, <|im_end|> (ids 256-258).

    Needs no file, so the tiny model has a real tokenizer offline; any text round-trips.
    """
    table = bytes_to_unicode()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = [table[b] for b in range(256)] + special
    return TextTokenizer(
        vocab=vocab,
        merges=[],
        special=special,
        eos_ids=frozenset({256, 258}),
        split_digits=False,
        eos_token="<|endoftext|>",
    )
