"""The sheet's limiting cell carries a limit the stage itself measured (core knows no part)."""

from recordkit import rec
from scalelab.lab.core.sheet import STAGE_LIMIT_KEY, build_sheet

SLOTS = "batch-slots: up to 4 sequences running, up to 4 waiting for a slot (engine /metrics)"


def test_a_stage_measured_limit_leads_the_limiting_cell() -> None:
    rows = build_sheet([
        rec("llm", "concurrency", 2, rate=100.0, extras={"cpu_busy_cores": 0.5}),
        rec("llm", "concurrency", 8, rate=150.0,
            extras={"cpu_busy_cores": 0.5, STAGE_LIMIT_KEY: SLOTS}),
    ])
    # Without the stage's line the cell says only what the machine showed.
    assert rows[0].limiting_resource == "none saturated (cpu 0.50/2 cores)"
    assert rows[1].limiting_resource == SLOTS


def test_a_saturated_machine_resource_follows_the_stage_limit() -> None:
    rows = build_sheet([rec("llm", "concurrency", 8, rate=150.0,
                            extras={"cpu_busy_cores": 1.9, STAGE_LIMIT_KEY: SLOTS})])
    assert rows[0].limiting_resource == f"{SLOTS}; cpu: 1.90/2 cores busy"


def test_repeats_give_the_line_most_of_them_said() -> None:
    other = SLOTS.replace("up to 4 waiting", "up to 3 waiting")
    rows = build_sheet([
        rec("llm", "concurrency", 8, repeat=i, rate=150.0, extras={STAGE_LIMIT_KEY: said})
        for i, said in enumerate([other, SLOTS, SLOTS])
    ])
    assert rows[0].limiting_resource == SLOTS


def test_a_target_measured_alone_keeps_its_multiple_when_its_base_is_stated() -> None:
    """A stage that measured its 10x target and had its curve cut: 10x, not 1x, when the
    record states its 1x level; the lowest level measured is 1x otherwise."""
    said = build_sheet([rec("retrieval", "corpus_multiple", 10.0, rate=5.0)
                        .model_copy(update={"base_level": 1.0})])
    assert [r.multiple for r in said] == [10.0]
    alone = build_sheet([rec("retrieval", "corpus_multiple", 10.0, rate=5.0)])
    assert [r.multiple for r in alone] == [1.0]
    both = build_sheet([rec("llm", "concurrency", 4.0, rate=5.0),
                        rec("llm", "concurrency", 40.0, rate=5.0)
                        .model_copy(update={"base_level": 2.0})])
    assert [r.multiple for r in both] == [2.0, 20.0]
