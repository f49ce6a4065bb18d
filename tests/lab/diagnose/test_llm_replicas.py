"""The llm stage's replica count comes from the capacity search's decided rate, not from the
highest grid concurrency that passed."""

from recordkit import rec
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import judge
from scalelab.lab.diagnose.stages.llm import LlmStage
from scalelab.lab.diagnose.stages.llm_config import LlmSettings


def _recs(with_search: bool) -> list[Record]:
    # 2, 4, 8 streams serve 20, 40, 44 requests/s; 8 streams miss p95 ≤ 60 ms.
    out = [rec("llm", "concurrency", c, rate=100.0 * c, p95=p, series="continuous",
               extras={"throughput_rps": rps})
           for c, rps, p in ((2, 20.0, 25), (4, 40.0, 30), (8, 44.0, 120))]
    if with_search:
        out += [rec("llm", "rate", lv, rate=lv * 8, p95=p, series="continuous capacity",
                    extras={"verdict": v})
                for lv, p, v in ((20, 25, "pass"), (30, 50, "pass"), (35, 200, "fail"))]
    return out


def _judge(with_search: bool) -> tuple[str, str]:
    s = LlmSettings(url="http://127.0.0.1:9", objectives=[{"metric": "p95_ms", "max": 60}],
                    target_multiple=10)
    goal = LlmStage().goals(s)[0]
    v = judge([goal], build_sheet(_recs(with_search)), cores=2, memory_bytes=2**34).stages[0]
    return v.intervention, v.predicted


def test_replicas_from_the_searched_capacity() -> None:
    # The 10x target: 20 requests/s served at 2 streams × 10 = 200 requests/s; one replica
    # held 30 at the objective: ceil(200 / 30) = 7 (the grid's 4 streams would say 5).
    do, predicted = _judge(with_search=True)
    assert "run 7 replica(s)" in do and "run 5 replica(s)" not in do
    assert ("7 replica(s) hold the 10× target of 200 requests/s (20 served at concurrency=2 × "
            "10) at the searched capacity of 30 requests/s each (measured;") in predicted


def test_without_a_search_the_grid_bound_says_what_it_is() -> None:
    # 4 streams passed: ceil(20 / 4) = 5 replicas, labelled a lower bound.
    do, predicted = _judge(with_search=False)
    assert "run 5 replica(s)" in do
    assert "the highest concurrency measured to pass, a lower bound" in predicted
