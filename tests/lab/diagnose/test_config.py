from pathlib import Path

import pytest
from pydantic import ValidationError

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.diagnose.commands import LoadRun, ServeRun
from scalelab.lab.diagnose.config import CONFIG, defaults_text, load_config, stored_config
from scalelab.lab.diagnose.goals import stage_goals
from scalelab.lab.diagnose.run import on_cluster
from scalelab.lab.diagnose.steps import Step


def test_defaults_and_modes() -> None:
    d = load_config(None, "default")
    q = load_config(None, "quick")
    f = load_config(None, "full")
    # the default is one repeat under a budget (the serve levels sized until decided);
    # --full repeats three times without one
    assert d.repeats == 1 and q.repeats == 1 and f.repeats == 3
    assert (d.budget, q.budget, f.budget) == ("4m20s", None, None)
    assert d.stages.data.levels == [1, 2, 5, 10]
    assert q.stages.train.workers == [1, 2]
    assert f.stages.data.sample_rows == 336776
    # Modes change the work, never the objectives.
    assert q.stages.serve.objectives == d.stages.serve.objectives
    assert [g.stage for g in stage_goals(d)] == ["data", "train", "serve", "llm", "model",
                                                "retrieval", "online"]
    serve = next(g for g in stage_goals(d) if g.stage == "serve")
    assert serve.baseline_series == "batching=off"
    assert [o.label for o in serve.objectives] == [
        "p95 ≤ 50 ms",
        "p99 ≤ 200 ms",
        "availability ≥ 99.9%",
    ]
    assert "objectives" in defaults_text()


def test_user_file_merges_over_defaults(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        "stages:\n  serve:\n    base_rate: 7\n    objectives:\n"
        "      - {metric: p99_ms, max: 10}\n  model: {enabled: false}\n"
    )
    c = load_config(p, "quick")
    assert c.stages.serve.base_rate == 7
    assert c.stages.serve.duration == "2s"  # from the quick mode
    assert [o.metric for o in c.stages.serve.objectives] == ["p99_ms"]
    assert not c.stages.model.enabled
    assert [g.stage for g in stage_goals(c)] == ["data", "train", "serve", "llm", "retrieval",
                                                "online"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("stages: [1, 2\n", "not valid YAML at line"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("repeats: 0\n", "repeats"),
        ("stages:\n  serve:\n    base_rate: -1\n", "stages.serve.base_rate"),
        ("stages:\n  serve:\n    typo_field: 1\n", "typo_field"),
        ("stages:\n  data:\n    objectives: [{metric: p96_ms, max: 1}]\n", "unknown objective"),
        ("custom: [{name: mine, kind: telepathy}]\n", "custom.0.kind"),
        ("client: {cluster: '127.0.0.1:8786'}\n", "client.cluster"),
        ("client: {clustr: 'tcp://h:8786'}\n", "client.clustr"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(BadInputError, match=needle):
        load_config(p)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_the_stages_section_comes_from_the_registry() -> None:
    from scalelab.lab.diagnose.config import DiagnoseConfig
    from scalelab.lab.diagnose.stages import SECTIONS, STAGES

    assert [s.name for s in STAGES] == ["data", "train", "serve", "llm", "model",
                                         "retrieval", "online", "custom"]
    cfg = load_config(None)
    for st in SECTIONS:
        assert isinstance(st.of(cfg), st.settings)
        assert st.name in defaults_text()  # every stage has its documented section
    # A stage's section is typed by its own settings model: unknown keys name the stage.
    with pytest.raises(ValidationError, match=r"stages\.train\.nope|train\.nope"):
        DiagnoseConfig.model_validate({"stages": {"train": {"nope": 1}}})


def test_client_cluster_reaches_only_the_load_and_sweep_steps(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("client: {cluster: 'tcp://10.0.0.5:8786'}\n")
    addr = load_config(p).client.cluster
    assert addr == "tcp://10.0.0.5:8786" and load_config(None).client.cluster is None
    load = Step(stage="serve", label="l", command=LoadRun(url="http://h:1/", rates=[1.0],
                                                          duration="1s"))
    argv = on_cluster(load, addr).command.to_argv()  # type: ignore[union-attr]
    assert argv == ["load", "run", "--json", "http://h:1/", "--cluster", "tcp://10.0.0.5:8786",
                    "--rates", "1", "--duration", "1s"]
    serve = Step(stage="serve", label="s", command=ServeRun(model_repo=Path("m"), port=1))
    assert on_cluster(serve, addr) is serve
    assert on_cluster(load, None) is load


def test_stored_config_is_the_runs_own_with_its_mode(tmp_path: Path) -> None:
    import yaml

    cfg = load_config(None, "quick")
    (tmp_path / CONFIG).write_text(yaml.safe_dump({"mode": "quick",
                                                   **cfg.model_dump(mode="json")}))
    got, mode = stored_config(tmp_path, None)
    assert (got, mode) == (cfg, "quick")
    assert stored_config(tmp_path / "none", None) == (load_config(None, "default"), "default")
    (tmp_path / CONFIG).write_text("repeats: many\n")
    bad = r"not a stored diagnose config \(repeats.*; pass --config$"
    with pytest.raises(BadInputError, match=bad):
        stored_config(tmp_path, None)
    (tmp_path / CONFIG).write_text("- a list\n")
    with pytest.raises(BadInputError, match="top level must be a mapping"):
        stored_config(tmp_path, None)
