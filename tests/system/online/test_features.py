"""Feature versions, encoding and the skew measures, with exact numbers."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from scalelab.lab.core.drift import linf, psi
from scalelab.lab.core.gate import compare, evaluation
from scalelab.layers.nets.feature_version import feature_version
from scalelab.layers.nets.flights import CATEGORICAL, NUMERIC
from scalelab.system.online.features import FeatureSpec, skew


def _frame(n: int, carrier: str = "UA", distance: float = 100.0) -> pl.DataFrame:
    cols: dict[str, object] = {c: [carrier if c == "carrier" else "X"] * n for c in CATEGORICAL}
    cols.update({c: [float(i % 10) for i in range(n)] for c in NUMERIC})
    cols["distance"] = [distance + i % 10 for i in range(n)]
    cols["delay_class"] = [i % 4 for i in range(n)]
    return pl.DataFrame(cols)


def test_psi_and_linf_by_hand() -> None:
    p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert math.isclose(psi(p, q), -0.25 * math.log(0.5) + 0.25 * math.log(1.5))
    assert psi(p, p) == 0.0
    assert linf({"a": 0.5, "b": 0.5}, {"a": 0.2, "c": 0.8}) == (0.8, "c")


def test_feature_version_is_the_content_not_the_writer() -> None:
    a = {"categorical": {"x": ["<UNK>", "a"]}, "numeric": {"n": {"mean": 0.1, "std": 1.0}},
         "classes": ["p", "q"]}
    b = {"classes": ["p", "q"], "numeric": {"n": {"std": 1.0, "mean": 0.1}},
         "categorical": {"x": ["<UNK>", "a"]}, "other": 1}
    assert feature_version(a) == feature_version(b)
    assert feature_version(a).startswith("fv1-") and len(feature_version(a)) == 20
    c = {**a, "categorical": {"x": ["<UNK>", "a", "b"]}}
    assert feature_version(c) != feature_version(a)


def test_encoding_maps_unknown_values_to_zero_and_imputes_the_mean() -> None:
    spec = FeatureSpec.fit(_frame(40))
    new = _frame(2, carrier="ZZ").with_columns(pl.Series("temp", [None, float("nan")]))
    cat, num = spec.encode(new)
    assert cat[:, 0].tolist() == [0, 0]  # ZZ was never seen: unknown
    assert cat[:, 1].tolist() == [1, 1]
    j = NUMERIC.index("temp")
    assert num[:, j].tolist() == [0.0, 0.0]  # null and NaN both impute to the mean
    assert spec.version == feature_version(spec.to_dict())


def test_skew_flags_a_rescaled_feature_only() -> None:
    spec = FeatureSpec.fit(_frame(1000))
    th = {"distance": (0.2, None), "carrier": (None, 0.1)}
    assert skew(spec, _frame(500), th) == {}
    out = skew(spec, _frame(500, distance=160.9), th)
    assert set(out) == {"distance"} and out["distance"]["psi"] > 0.2
    assert skew(spec, _frame(500, carrier="B6"), th)["carrier"]["linf"] == 1.0
    assert skew(spec, _frame(50, distance=160.9), th) == {}  # too few rows to judge


def test_the_gate_rule_in_numbers() -> None:
    y = np.array([0, 0, 1, 1, 2])
    e = evaluation(1, y, np.array([0, 0, 1, 0, 2]), ["a", "b", "c", "d"])
    assert e.accuracy == 0.8 and e.per_class_f1 == {"a": 0.8, "b": 2 / 3, "c": 1.0, "d": None}
    assert math.isclose(e.macro_f1, (0.8 + 2 / 3 + 1.0) / 3)
    worse = evaluation(2, y, np.array([0, 0, 0, 0, 2]), ["a", "b", "c", "d"])
    assert compare(e, worse, 0.05) == [
        "accuracy 0.6000 < current 0.8000 - tolerance 0.05",
        "macro F1 0.5556 < current 0.8222 - tolerance 0.05",
        "class 'a' F1 0.6667 < current 0.8000 - tolerance 0.05",
        "class 'b' F1 0.0000 < current 0.6667 - tolerance 0.05"]
    assert compare(e, e, 0.0) == []
