import numpy as np
import pytest

from scalelab.lab.core.quality import quality_key, scores

CLASSES = ["a", "b", "c", "d"]


def test_hand_computed_case_with_an_absent_class() -> None:
    # a: tp 2 fp 1 fn 1 -> F1 2/3; b: tp 1 fp 1 fn 1 -> 1/2; c: occurs once, never predicted -> 0;
    # d: neither occurs nor is predicted -> undefined, out of the macro mean.
    y = np.array([0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 1, 1, 0, 0])
    q = scores(y, p, CLASSES)
    a, b, c, d = q.classes
    assert (a.precision, a.recall, a.f1) == (pytest.approx(1 / 2), pytest.approx(2 / 3),
                                             pytest.approx(4 / 7))
    assert (b.f1, c.f1, c.support, c.predicted) == (0.5, 0.0, 1, 0)
    assert not d.defined and c.defined
    assert q.macro_f1 == pytest.approx((4 / 7 + 1 / 2 + 0) / 3)
    assert q.per_class_f1 == {"a": pytest.approx(4 / 7), "b": 0.5, "c": 0.0, "d": None}
    assert q.weighted_f1 == pytest.approx((3 * 4 / 7 + 2 * 0.5) / 6)
    assert q.accuracy == pytest.approx(3 / 6)
    assert q.as_dict()[quality_key("f1", "b")] == 0.5 and quality_key("f1", "b") == "f1.b"


@pytest.mark.parametrize("seed", range(6))
def test_matches_sklearn_zero_division_0_over_present_labels(seed: int) -> None:
    metrics = pytest.importorskip("sklearn.metrics")  # installed with sentence-transformers
    f1_score, precision_recall_fscore_support = (metrics.f1_score,
                                                 metrics.precision_recall_fscore_support)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    # Few draws over many classes, so classes go missing from y, from p or from both.
    y = rng.integers(0, 4, n)
    p = np.where(rng.random(n) < 0.5, y, rng.integers(2, 6, n))
    q = scores(y, p, [str(i) for i in range(6)])
    assert q.macro_f1 == pytest.approx(f1_score(y, p, average="macro", zero_division=0))
    present = sorted(set(y) | set(p))
    pr, rc, f1, sup = precision_recall_fscore_support(y, p, labels=present, zero_division=0)
    assert q.macro_precision == pytest.approx(float(np.mean(pr)))
    assert q.macro_recall == pytest.approx(float(np.mean(rc)))
    assert q.weighted_f1 == pytest.approx(f1_score(y, p, average="weighted", zero_division=0))
    for label, f, s in zip(present, f1, sup, strict=True):
        assert q.classes[label].f1 == pytest.approx(f) and q.classes[label].support == s
    assert [c.defined for c in q.classes] == [i in present for i in range(6)]


def test_empty_input_scores_zero() -> None:
    q = scores(np.zeros(0), np.zeros(0), CLASSES)
    assert (q.n, q.accuracy, q.macro_f1) == (0, 0.0, 0.0)
