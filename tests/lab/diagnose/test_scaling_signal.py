"""The "do" line's autoscaling signal is decided on the run's own levels (replayed through the
HPA simulator), or labelled a rule of thumb; never a canned reason."""

from recordkit import M
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Latency, Record, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.units import format_percent
from scalelab.lab.core.verdict import StageGoal, judge_stage
from scalelab.lab.diagnose.scaling_signal import choose_signal
from scalelab.lab.diagnose.stages import serve

P95 = [Objective(metric="p95_ms", max=50)]


def _rec(offered: float, served: float, p50: float, *, p999: bool = True) -> Record:
    lat = Latency(p50_ms=p50, p90_ms=p50 * 1.5, p95_ms=p50 * 2, p99_ms=p50 * 3,
                  p999_ms=p50 * 4 if p999 else None)
    return make_record(experiment="t", stage="serve", variable="rate", level=offered,
                       rate=served, latency=lat, machine=M,
                       extras={"series": "batching=off", "mean_ms": p50 * 1.1, "samples": 2000})


def test_the_signal_is_cited_from_a_replay_of_the_levels() -> None:
    # One replica saturating at 170 requests/s; the 10x spike goes from 40 to 400 requests/s.
    rows = build_sheet([_rec(40, 40, 5), _rec(80, 80, 8), _rec(200, 160, 40),
                        _rec(400, 170, 900)])
    c = choose_signal(rows, P95, target_multiple=10, candidates=("queue", "cpu"))
    assert [r.signal for r in c.runs] == ["queue", "cpu"]
    best, other = (c.runs if c.runs[0].signal == c.signal else c.runs[::-1])
    assert best.violating_share <= other.violating_share
    assert c.text.startswith(f"autoscale on {'queue depth' if c.signal == 'queue' else 'CPU'} "
                             "(this run's levels replayed through the HPA simulator, a spike "
                             "from 40 to 400 requests/s, replicas ready 30 s after they start: ")
    assert (f"p95<50ms missed for {format_percent(best.violating_share)} against "
            f"{format_percent(other.violating_share)} of requests)") in c.text
    assert all(r.reacted_s is not None and r.reacted_s > 0 for r in c.runs)


def test_other_levels_give_other_numbers() -> None:
    a = choose_signal(build_sheet([_rec(40, 40, 5), _rec(80, 80, 8), _rec(200, 160, 40)]),
                      P95, target_multiple=10, candidates=("queue", "cpu"))
    b = choose_signal(build_sheet([_rec(40, 40, 5), _rec(80, 80, 20), _rec(200, 100, 400)]),
                      P95, target_multiple=10, candidates=("queue", "cpu"))
    c = choose_signal(build_sheet([_rec(20, 20, 5), _rec(80, 80, 20), _rec(200, 100, 400)]),
                      P95, target_multiple=10, candidates=("queue", "cpu"))
    assert [r.violating_share for r in a.runs] != [r.violating_share for r in b.runs]
    assert a.text != b.text
    assert "a spike from 20 to 200 requests/s" in c.text


def test_levels_that_cannot_be_replayed_say_rule_of_thumb() -> None:
    rows = build_sheet([_rec(40, 40, 5, p999=False), _rec(80, 80, 8, p999=False)])
    c = choose_signal(rows, P95, target_multiple=10, candidates=("queue", "cpu"))
    assert c.runs == () and c.text == (
        "autoscale on queue depth (rule of thumb, not measured here: no level recorded a "
        "served rate with p50 to p99.9)")
    no_latency = choose_signal(build_sheet([_rec(40, 40, 5)]),
                               [Objective(metric="availability", min=0.99)],
                               target_multiple=10, candidates=("queue", "cpu"))
    assert "rule of thumb" in no_latency.text and no_latency.runs == ()


def test_the_serving_do_line_carries_the_replay() -> None:
    recs = [_rec(40, 40, 5), _rec(80, 80, 8), _rec(200, 160, 40), _rec(400, 170, 900)]
    goal = StageGoal(stage="serve", objectives=P95, baseline_series="batching=off",
                     target_multiple=10, advisor=serve.advise)
    v = judge_stage(goal, build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    assert "lead" not in v.intervention and "lags" not in v.intervention
    assert "replayed through the HPA simulator, a spike from 40 to 400" in v.intervention
