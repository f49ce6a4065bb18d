"""llama.cpp's logits over token windows: a script that llama-cpp-python's interpreter runs.

The other side of `generate quality --llamacpp` (generate.llamacpp): never imported by
scalelab, which does not depend on llama-cpp-python; only the standard library, numpy and
llama_cpp here.

    PYTHON llamacpp_logits.py < request.json > reference.json

Input (stdin, JSON): {"model": GGUF path, "threads": n, "windows": [[token ids], ...]}: each
window is read as one sequence from an empty context, all its tokens but the last in one batch
(the windows `quality.windows` cuts: each token is predicted from the ones before it).
Output (stdout, one JSON document): the request's model and windows, llama_cpp's version, and
per window, at every position but the last, the argmax of llama.cpp's logits ("argmax"), the
gap between its two largest logits ("margin": how near a tie the choice was), and the negative
log-likelihood of the next token in the window ("nll"), all from `Llama(logits_all=True)`.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def score(doc: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    windows: list[list[int]] = doc["windows"]
    longest = max(len(w) for w in windows)
    llm = llama_cpp.Llama(
        model_path=doc["model"], n_ctx=max(512, longest), n_batch=max(512, longest),
        n_ubatch=max(512, longest), n_threads=doc["threads"], n_threads_batch=doc["threads"],
        logits_all=True, verbose=False,
    )
    argmax: list[list[int]] = []
    margin: list[list[float]] = []
    nll: list[list[float]] = []
    for ids in windows:
        llm.reset()
        llm.eval(ids[:-1])
        logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)
        top2 = np.sort(np.partition(logits, -2, axis=1)[:, -2:], axis=1)
        peak = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - peak).sum(axis=1)) + peak[:, 0]
        nxt = np.asarray(ids[1:])
        argmax.append(logits.argmax(axis=1).tolist())
        margin.append(np.round(top2[:, 1] - top2[:, 0], 5).tolist())
        nll.append(np.round(lse - logits[np.arange(len(nxt)), nxt], 6).tolist())
    return {"model": doc["model"], "windows": windows, "llama_cpp": llama_cpp.__version__,
            "threads": doc["threads"], "argmax": argmax, "margin": margin, "nll": nll}


if __name__ == "__main__":
    json.dump(score(json.load(sys.stdin)), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
