"""The bench end to end through `scalelab compress` on the small trained flights model (one run,
many checks)."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from requires import have
from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.layers.nets import registry

from .conftest import Flights

HAVE_ORT = have("onnx", "onnxruntime")
VARIANTS = ("int8,fold,prune-structured-50,prune-unstructured-90,distill,cascade,cache"
            + (",onnx,onnx-int8" if HAVE_ORT else ""))


@pytest.fixture(scope="module")
def compressed(flights: Flights, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("compress")
    repo = out / "repo"
    (repo / "flights").mkdir(parents=True)
    (repo / "flights" / "config.json").write_bytes(
        (flights.repo / "flights" / "config.json").read_bytes())
    capsys_out = out / "stdout.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = run(["compress", "--model", str(flights.version), "--data", str(flights.data),
                  "--variants", VARIANTS, "--device", "cpu", "--publish", str(repo),
                  "--lineage", str(out / "lineage.db"), "--records", str(out / "r.jsonl"),
                  "--plot", str(out / "pareto.png"), "--max-train-rows", "6000",
                  "--max-test-rows", "2000", "--epochs", "2", "--finetune-epochs", "1",
                  "--calls", "20", "--rounds", "2", "--cache-requests", "300",
                  "--taus", "0.6,0.8,0.95",
                  "--json"])
    capsys_out.write_text(buf.getvalue())
    assert rc == 0, buf.getvalue()
    return {"doc": json.loads(buf.getvalue()), "dir": out, "repo": repo}


def _row(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in doc["variants"] if r["name"] == name)


def test_every_variant_is_measured_per_class(compressed: dict[str, Any]) -> None:
    doc = compressed["doc"]
    names = [r["name"] for r in doc["variants"]]
    assert names[0] == "fp32"
    for n in VARIANTS.split(","):
        assert n in names
    assert {"prune-structured-50-masked", "student-labels", "distill-unfolded"} <= set(names)
    for r in doc["variants"]:
        assert set(r["quality"]["per_class"]) == {"on_time", "late_15_60", "late_60_plus",
                                                  "cancelled"}
        assert set(r["latency"]) == {"1", "32"}
        assert r["device"].startswith("cpu")
        assert r["cost_per_1000_usd"] > 0
        d = r["delta"]
        assert d["worst_class_points"] == min(d["per_class_f1_points"].values())
        assert all(d["per_class_f1_points"][c] < -1.0 for c in d["flagged"])
    assert _row(doc, "fp32")["delta"]["macro_f1_points"] == 0.0
    assert _row(doc, "cache")["quality"] == _row(doc, "fp32")["quality"]


def test_structured_pruning_removed_channels(compressed: dict[str, Any]) -> None:
    ex = _row(compressed["doc"], "prune-structured-50")["extras"]
    assert ex["hidden_before"] == [64, 64] and ex["hidden_after"] == [32, 32]
    assert ex["parameters_after"] < ex["parameters_before"]
    assert ex["max_abs_diff_vs_masked_before_finetune"] < 1e-5
    assert _row(compressed["doc"], "prune-unstructured-90")["extras"]["sparsity"] == (
        pytest.approx(0.9, abs=0.01))
    assert _row(compressed["doc"], "int8")["size_ratio"] < 0.6


def test_int8_keeps_the_faster_measured_path(compressed: dict[str, Any]) -> None:
    row = _row(compressed["doc"], "int8")
    timings = row["extras"]["candidates_p50_ms_batch1"]
    assert set(timings) == ({"torch", "onnxruntime"} if HAVE_ORT else {"torch"})
    assert row["parameters"]["backend"] == min(timings, key=timings.__getitem__)
    assert row["delta"]["macro_f1_points"] > -5.0


def test_fold_is_exact_and_the_student_is_served_folded(compressed: dict[str, Any]) -> None:
    doc = compressed["doc"]
    fold = _row(doc, "fold")
    assert fold["extras"]["max_abs_logit_diff"] < 1e-4
    assert fold["quality"]["macro_f1"] == pytest.approx(_row(doc, "fp32")["quality"]["macro_f1"],
                                                        abs=1e-3)
    # folding changes no prediction of the student beyond float rounding
    assert _row(doc, "distill")["quality"]["macro_f1"] == pytest.approx(
        _row(doc, "distill-unfolded")["quality"]["macro_f1"], abs=1e-3)
    specs = {p["variant"]: registry.read_spec(p["path"]) for p in doc["published"]}
    assert specs["distill"]["architecture"] == specs["fold"]["architecture"] == "tabular_folded"
    assert specs["cascade"]["params"]["small"]["architecture"] == "tabular_folded"


def test_distillation_study_and_cascade_sweep(compressed: dict[str, Any]) -> None:
    doc = compressed["doc"]
    study = _row(doc, "distill")["extras"]["study"]
    assert study["labelled_rows"] == study["transfer_rows"] == 3000
    assert all(0 <= v <= 1 for k, v in study.items()
               if k.startswith(("macro_f1", "teacher_agreement")))
    assert study["teacher_agreement.distilled_labelled_plus_transfer"] > 0.5
    cas = _row(doc, "cascade")
    sweep = cas["extras"]["sweep"]
    assert [s["tau"] for s in sweep] == [0.6, 0.8, 0.95]
    shares = [s["share_to_large"] for s in sweep]
    assert shares == sorted(shares)  # a higher threshold routes more rows to the large model
    assert cas["parameters"]["tau"] in (0.6, 0.8, 0.95)
    cache = _row(doc, "cache")["extras"]["cache"]
    assert 0 < cache["hit_rate"] < 1 and cache["requests"] == 300


def test_records_validate(compressed: dict[str, Any]) -> None:
    recs = read_records(compressed["dir"] / "r.jsonl")
    assert len(recs) == len(compressed["doc"]["variants"])
    assert [r.level for r in recs] == [float(i) for i in range(len(recs))]
    for r, row in zip(recs, compressed["doc"]["variants"], strict=True):
        assert (r.stage, r.variable, r.experiment) == ("model", "variant",
                                                       compressed["doc"]["experiment"])
        assert r.extras["variant"] == row["name"]
        assert r.quality["macro_f1"] == row["quality"]["macro_f1"]
        assert r.latency is not None and r.latency.p50_ms is not None
        if r.extras["variant"] != "cache":  # its batch-1 timing is the cache's replay
            # order statistics of every timed batch-1 call (20 calls x 2 rounds)
            assert r.extras["samples"] == 40 and r.extras["samples_unit"] == "calls"
            lat = r.latency
            assert lat.p50_ms <= lat.p95_ms <= lat.p99_ms <= lat.max_ms  # type: ignore[operator]
        assert r.cost is not None and r.cost.unit == "1,000 predictions"
        assert r.machine.device == row["device"]
        # Measured resident memory of the process while the variant ran, every variant (ONNX
        # included); the tensor estimate and the weights are fields of their own.
        assert r.peak_memory_bytes is not None
        assert r.peak_memory_bytes > (r.extras["tensor_peak_bytes"] or 0)
        assert r.peak_memory_bytes > (r.extras["model_bytes"] or 0)
    assert (compressed["dir"] / "pareto.png").stat().st_size > 1000


def test_published_versions_load_through_the_registry(compressed: dict[str, Any]) -> None:
    pub = compressed["doc"]["published"]
    expected = ["int8", "fold", "prune-structured-50", "prune-unstructured-90", "distill",
                "cascade"] + (["onnx", "onnx-int8"] if HAVE_ORT else [])
    assert [p["variant"] for p in pub] == expected
    assert [p["version"] for p in pub] == list(range(1, len(expected) + 1))
    c, x = torch.zeros((3, 4), dtype=torch.long), torch.zeros((3, 14))
    for p in pub:
        m = registry.load_module(p["path"])
        with torch.inference_mode():
            assert m(c, x).shape == (3, 4)
        manifest = json.loads((Path(p["path"]) / "manifest.json").read_text())
        assert manifest["quality"]["macro_f1"] == _row(compressed["doc"],
                                                       p["variant"])["quality"]["macro_f1"]
        assert isinstance(p["lineage_node"], int)
    # each published version is its own node in the lineage graph
    assert len({p["lineage_node"] for p in pub}) == len(pub)


def test_bad_input_exits_2(flights: Flights, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compress", "--model", str(flights.version), "--data", str(flights.data)]
    assert run([*base, "--variants", "int4"]) == 2
    assert "unknown variant 'int4'" in capsys.readouterr().err
    assert run([*base, "--variants", "prune-structured-abc"]) == 2
    assert run([*base, "--plot", str(tmp_path / "p.jpg")]) == 2
    assert run(["compress", "--model", str(flights.version), "--data", str(tmp_path)]) == 2
    assert "train.parquet" in capsys.readouterr().err
    assert run(["compress", "--model", str(tmp_path), "--data", str(flights.data)]) == 2
    assert "model.json" in capsys.readouterr().err
