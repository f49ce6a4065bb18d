"""The transformer's training text: the Python standard library's own sources, byte-tokenized,
packed into fixed-length sequences in a seeded order.

Why this corpus: it is on every machine that runs scalelab (no download), it is real text no one
here wrote, and it is large (the top-level modules alone are ~8 MB). The files are the `*.py`
directly in the interpreter's stdlib folder, sorted by name, so two machines with the same Python
version read the same bytes; the digest of what was read goes into the run's report.

Why bytes: a byte-level tokenizer (256 byte values + one end-of-document token) needs no
vocabulary file and no download, and its vocabulary is small enough that the embedding and output
tables do not dominate a small model. Documents are joined with the end token and cut into
sequences of seq + 1 tokens (inputs are the first seq, targets the last seq): packing wastes no
padding. The order of the sequences is a permutation seeded by `seed`; the last `val_fraction` of
the packed stream (before shuffling) is held out, so validation text never appears in training.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelab.lab.core.errors import BadInputError, BadUsageError

EOS = 256
VOCAB_SIZE = 257
"""256 byte values and the end-of-document token."""


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The top-level `*.py` modules of the standard library, sorted by name."""
    base = root or Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in base.glob("*.py") if p.is_file())
    if not files:
        raise BadInputError(f"no Python sources in {base}; pass a folder of text files instead")
    return files


def encode(text: bytes) -> list[int]:
    """Byte-level tokens: each byte is its own id."""
    return list(text)


def decode(ids: list[int]) -> bytes:
    return bytes(i for i in ids if i < EOS)


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """Packed sequences: train (n, seq + 1) and validation (k, seq + 1) int64 tokens."""

    train: torch.Tensor
    val: torch.Tensor
    seq: int
    tokens: int
    """Tokens read (before cutting into whole sequences)."""
    files: int
    digest: str
    """sha256 of the bytes read, in order (identifies the corpus)."""


def load_corpus(*, seq: int, max_tokens: int, seed: int, val_fraction: float = 0.05,
                root: Path | None = None) -> Corpus:
    """Read files in name order until `max_tokens` tokens, pack, split, shuffle (seeded)."""
    if seq < 2:
        raise BadUsageError(f"--seq must be >= 2 tokens; got {seq}")
    if max_tokens < 2 * (seq + 1):
        raise BadUsageError(f"--tokens {max_tokens} is fewer than two sequences of {seq + 1}")
    if not 0 < val_fraction < 1:
        raise BadUsageError(f"val_fraction must be in (0, 1); got {val_fraction}")
    h = hashlib.sha256()
    stream: list[int] = []
    n_files = 0
    for path in stdlib_files(root):
        data = path.read_bytes()
        take = data[: max_tokens - len(stream)]
        h.update(take)
        stream.extend(encode(take))
        n_files += 1
        if len(stream) >= max_tokens:
            break
        stream.append(EOS)
        h.update(b"\x00EOS\x00")
    width = seq + 1
    n = len(stream) // width
    if n < 2:
        raise BadInputError(f"the corpus gave {len(stream)} tokens: not two sequences of {width}")
    packed = torch.tensor(stream[: n * width], dtype=torch.int64).view(n, width)
    n_val = max(1, round(n * val_fraction))
    train, val = packed[: n - n_val], packed[n - n_val:]
    perm = torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(seed))
    return Corpus(train=train[perm].contiguous(), val=val.contiguous(), seq=seq,
                  tokens=len(stream), files=n_files, digest=h.hexdigest())


def batch_at(train: torch.Tensor, step: int, batch: int) -> torch.Tensor:
    """The global batch of `step`: rows step·batch … (cycling), a pure function of the step."""
    n = train.shape[0]
    if batch > n:
        raise BadUsageError(f"global batch {batch} exceeds the {n} training sequences; "
                            "lower --batch or raise --tokens")
    idx = (torch.arange(batch) + step * batch) % n
    return train[idx]
