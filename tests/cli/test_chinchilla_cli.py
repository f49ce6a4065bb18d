"""`scalelab fit chinchilla` and `scalelab plan chinchilla`: JSON, the --fit hand-off, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clikit import fails, run_json
from scalelab.cli import run
from scalelab.layers.plan.chinchilla import EPOCH_PARAMS, ChinchillaParams, compute_optimal

EPOCH_CSV = (Path(__file__).resolve().parents[1] / "layers" / "plan" / "data"
             / "chinchilla_epoch.csv")
FAST = ["--grid-points", "2", "--bootstrap", "0"]


def test_fit_json_reproduces_epoch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = run_json(capsys, "fit", "chinchilla", "--csv", str(EPOCH_CSV), "--drop-highest", "5", *FAST)
    assert (d["rows_read"], d["dropped_highest"], d["n_points"]) == (245, 5, 240)
    assert d["d_source"] == "C/(6N) from column 'Training FLOP'"
    assert d["alpha"] == pytest.approx(EPOCH_PARAMS.alpha, abs=0.005)
    assert d["beta"] == pytest.approx(EPOCH_PARAMS.beta, abs=0.005)
    assert d["E"] == pytest.approx(EPOCH_PARAMS.E, abs=0.01)
    assert d["A"] == pytest.approx(EPOCH_PARAMS.A, rel=0.05)
    assert d["B"] == pytest.approx(EPOCH_PARAMS.B, rel=0.05)
    assert d["standard_errors"] is None and d["warnings"] == []

    # The fit's JSON is what `plan chinchilla --fit` reads.
    fit_file = tmp_path / "fit.json"
    fit_file.write_text(json.dumps(d))
    p = run_json(capsys, "plan", "chinchilla", "--compute", "1e21", "--fit", str(fit_file))
    law = ChinchillaParams(**{k: d[k] for k in ("E", "A", "B", "alpha", "beta")})
    assert p["params_source"] == f"--fit {fit_file}"
    assert p["plans"][0]["n_opt"] == pytest.approx(compute_optimal(law, 1e21).n_opt, rel=1e-12)


def test_fit_with_tokens_column_and_bootstrap(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    truth = ChinchillaParams(E=0.3, A=10.0, B=50.0, alpha=0.4, beta=0.5)
    lines = ["params,rows,val_loss"]
    for n in (1e3, 1e4, 1e5):
        for d in (1e3, 1e4, 1e5):
            lines.append(f"{n},{d},{truth.predict(n, d)}")
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join(lines) + "\n")
    d = run_json(capsys, "fit", "chinchilla", "--csv", str(csv), "--n-col", "params", "--d-col",
                 "rows", "--loss-col", "val_loss", "--grid-points", "2", "--bootstrap", "3")
    assert d["n_points"] == 9 and d["d_source"] == "column 'rows'"
    assert (d["E"], d["alpha"], d["beta"]) == pytest.approx((0.3, 0.4, 0.5), rel=1e-3)
    assert set(d["standard_errors"]) == {"E", "A", "B", "alpha", "beta"}


def test_fit_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["fit", "chinchilla", "--csv", str(EPOCH_CSV), "--drop-highest", "5", *FAST]) == 0
    out = capsys.readouterr().out
    assert "Chinchilla fit" in out and "240 points (245 read, 5 highest-loss dropped)" in out


def test_plan_defaults_to_epoch_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    p = run_json(capsys, "plan", "chinchilla", "--compute", "1e21,1e22", "--model-size", "1e10")
    assert p["params"] == {"E": 1.8169, "A": 482.01, "B": 2085.43, "alpha": 0.34781,
                           "beta": 0.36585}
    assert "Epoch AI" in p["params_source"]
    first = p["plans"][0]
    expect = compute_optimal(EPOCH_PARAMS, 1e21)
    for key in ("n_opt", "d_opt", "tokens_per_param", "loss", "dloss_dcompute",
                "dloss_per_doubling"):
        assert first[key] == pytest.approx(getattr(expect, key), rel=1e-12)
    assert [round(x["compute"]) for x in p["plans"]] == [10**21, 10**22]
    m = p["model_size"][0]
    assert m["n"] == 1e10 and m["excess_loss"] > 0 and 0 < m["compute_efficiency"] < 1

    assert run(["plan", "chinchilla", "--compute", "1e21"]) == 0
    out = capsys.readouterr().out
    assert "Epoch AI" in out and "N_opt" in out


def test_plan_with_params(capsys: pytest.CaptureFixture[str]) -> None:
    p = run_json(capsys, "plan", "chinchilla", "--compute", "5.76e23", "--params",
                 "1.69,406.4,410.7,0.34,0.28")
    assert p["params_source"] == "--params"
    assert p["plans"][0]["n_exponent"] == pytest.approx(0.28 / 0.62, rel=1e-12)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--params", "1,2,3", "--compute", "1e21"], "5 numbers"),
        (["--params", "1,2,3,0.3,x", "--compute", "1e21"], "not a number"),
        (["--params", "1,2,3,0,0.3", "--compute", "1e21"], "no compute-optimal split"),
        (["--compute", "-1e21"], "compute must be"),
        (["--compute", "lots"], "not a number"),
        (["--compute", "1e21", "--model-size", "-5"], "model size"),
    ],
)
def test_plan_bad_input_exits_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                match: str) -> None:
    assert match in fails(capsys, "plan", "chinchilla", *args)


def test_plan_fit_file_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON (line 1" in fails(capsys, "plan", "chinchilla", "--compute", "1e21",
                                          "--fit", str(bad))
    bad.write_text(json.dumps({"E": 1.0}))
    assert "needs numbers" in fails(capsys, "plan", "chinchilla", "--compute", "1e21", "--fit",
                                    str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"params": {"E": 1, "A": 2, "B": 3, "alpha": 0.3, "beta": 0.3}}))
    assert "not both" in fails(capsys, "plan", "chinchilla", "--compute", "1e21", "--fit",
                               str(good), "--params", "1,2,3,0.3,0.3")


def _csv(tmp_path: Path, text: str) -> str:
    p = tmp_path / "data.csv"
    p.write_text(text)
    return str(p)


def test_fit_bad_csv_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows = "".join(f"{i}000000,{6 * i}e9,{3 - i / 10}\n" for i in range(1, 8))
    good = "Model Size,Training FLOP,loss\n" + rows

    msg = fails(capsys, "fit", "chinchilla", "--csv",
                _csv(tmp_path, good.replace("loss", "xent")))
    assert "no column 'loss' for --loss-col" in msg and "'xent'" in msg
    msg = fails(capsys, "fit", "chinchilla", "--csv",
                _csv(tmp_path, good.replace("Training FLOP", "tokens")))
    assert "--c-col" in msg and "--d-col" in msg
    msg = fails(capsys, "fit", "chinchilla", "--csv",
                _csv(tmp_path, good.replace("\n2000000,", "\n-2000000,", 1)))
    assert "line 3, column 'Model Size'" in msg and "> 0" in msg
    msg = fails(capsys, "fit", "chinchilla", "--csv",
                _csv(tmp_path, good.replace(",2.9\n", ",\n", 1)))
    assert "line 2, column 'loss'" in msg
    msg = fails(capsys, "fit", "chinchilla", "--csv", _csv(tmp_path, good), "--drop-highest", "3")
    assert "at least 6 points" in msg
    assert "no data rows" in fails(capsys, "fit", "chinchilla", "--csv",
                                   _csv(tmp_path, "Model Size,Training FLOP,loss\n"))
    msg = fails(capsys, "fit", "chinchilla", "--csv", _csv(tmp_path, good), "--drop-highest", "9")
    assert "--drop-highest 9" in msg
    assert "does not exist" in fails(capsys, "fit", "chinchilla", "--csv",
                                     str(tmp_path / "missing.csv"))
