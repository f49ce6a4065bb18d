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


def plain_cpu_buffers() -> None:
    """Keep the weights in llama.cpp's plain CPU buffers (its `--no-extra-bufts`): the Q4_1
    blocks as the file holds them, dotted with Q8_1-quantized activations, the path every CPU
    runs. The extra buffer types repack them (AMX tiles, interleaved rows): on an AMX CPU
    llama-cpp-python 0.3.36 built natively segfaults in ggml_backend_amx_mul_mat (measured)."""
    import llama_cpp.llama_cpp as c

    default = c.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    c.llama_model_default_params = params


def score(doc: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    plain_cpu_buffers()

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
