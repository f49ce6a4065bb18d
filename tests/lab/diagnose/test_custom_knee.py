"""The knee `scalelab sweep` finds for a user's command reaches the verdict's prediction."""

from recordkit import M, rec
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import judge_stage
from scalelab.lab.diagnose.stages.custom import STAGE, CustomStages, sweep_knee


def _rows(rates: list[float]) -> list[SheetRow]:
    return build_sheet([rec("job", "workers", lv, rate=x, rate_unit="items/s")
                        for lv, x in zip((1, 2, 4, 8), rates, strict=True)])


def test_the_knee_is_cited_with_its_measured_rate() -> None:
    # Normalised, 190 and 250 items/s sit 0.42 and 0.51 above the chord: Kneedle's knee is 4.
    assert sweep_knee(_rows([100, 190, 250, 260])) == (
        "the rate curve bends at workers=4 (250 items/s, measured; Kneedle, the knee scalelab "
        "sweep reports): past it more workers buy less")
    assert sweep_knee(_rows([100, 200, 400, 800])).startswith(
        "no knee in the rate over workers 1 to 8")


def test_a_custom_sweep_stages_prediction_carries_the_knee() -> None:
    stages = CustomStages.model_validate([
        {"name": "job", "kind": "sweep", "var": "workers", "levels": [1, 2, 4, 8],
         "command": ["true", "{workers}"], "objectives": [{"metric": "efficiency", "min": 0.5}]}])
    goal = STAGE.goals(stages)[0]
    v = judge_stage(goal, _rows([100, 190, 250, 260]), cores=8, memory_bytes=M.memory_bytes)
    assert "the rate curve bends at workers=4 (250 items/s" in v.predicted
