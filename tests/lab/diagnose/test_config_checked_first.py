"""The whole objectives file is checked before anything runs: one line per mistake naming its
key path and the fix, exit 2, no records written and no step started."""

import sys
from pathlib import Path

import pytest

from scalelab.cli import run

MARK = "ran.txt"


def _config(tmp_path: Path, mistake: str) -> Path:
    """A config whose first custom stage would leave a marker file if any step ran, plus one
    mistake (YAML text merged at the top level)."""
    marker = tmp_path / MARK
    p = tmp_path / "scalelab.yaml"
    p.write_text(
        "repeats: 1\n"
        "stages: {data: {enabled: false}, train: {enabled: false}, serve: {enabled: false},"
        " llm: {enabled: false}, model: {enabled: false}, retrieval: {enabled: false},"
        " online: {enabled: false}}\n"
        + mistake.replace("CUSTOM", "custom:\n"
                          f"  - {{name: toucher, kind: sweep, levels: [1], var: n,"
                          f" command: ['{sys.executable}', '-c',"
                          f" 'open(r\"{marker}\", \"w\").write(\"{{n}}\")']}}\n")
    )
    return p


@pytest.mark.parametrize(
    ("mistake", "line"),
    [
        # an objective's metric, in a custom stage (today checked only after the stages ran)
        ("CUSTOM  - {name: mine, kind: sweep, command: [x, '{workers}'],"
         " objectives: [{metric: p96_ms, max: 5}]}\n",
         "custom.1.objectives.0: unknown objective metric 'p96_ms'; use one of"),
        # an objective's metric, in a built-in stage
        ("stages: {serve: {objectives: [{metric: latency, max: 5}]}}\nCUSTOM",
         "stages.serve.objectives.0: unknown objective metric 'latency'; use one of"),
        # an objective's bound
        ("stages: {llm: {objectives: [{metric: p95_ms, min: 1, max: 5}]}}\nCUSTOM",
         "stages.llm.objectives.0: objective 'p95_ms' needs exactly one of min or max"),
        # a stage's name under stages:
        ("stages: {serv: {base_rate: 5}}\nCUSTOM",
         "stages.serv: no such stage; the stages are data, train, serve, llm,"),
        # a custom stage's name: taken by a built-in stage
        ("CUSTOM  - {name: serve, kind: load, url: 'http://127.0.0.1:9/x'}\n",
         "custom: custom stage name 'serve' is a built-in stage's; rename it"),
        # ... or by another custom stage
        ("CUSTOM  - {name: toucher, kind: load, url: 'http://127.0.0.1:9/x'}\n",
         "custom: two custom stages are named 'toucher'; give each its own name"),
        # URLs
        ("stages: {serve: {url: 'localhost:8000/predict'}}\nCUSTOM",
         "stages.serve.url: URL 'localhost:8000/predict' is not an http(s) or grpc URL; give e.g."),
        ("stages: {llm: {url: 'http://127.0.0.1:8000/v1'}}\nCUSTOM",
         "stages.llm: url path '/v1' does not match api chat (/v1/chat/completions); give the"
         " server's base URL"),
        ("CUSTOM  - {name: mine, kind: load, url: 'http://127.0.0.1:99999/x'}\n",
         "custom.1.url: URL 'http://127.0.0.1:99999/x' has a bad port"),
        ("CUSTOM  - {name: mine, kind: load}\n",
         "custom.1: kind load needs url: the HTTP endpoint to load, e.g."),
        ("CUSTOM  - {name: mine, kind: sweep, var: n}\n",
         "custom.1: kind sweep needs command: the command to run per level, with {n} where"),
        # levels
        ("stages: {serve: {levels: [0, 1]}}\nCUSTOM",
         "stages.serve.levels: levels must be > 0 (got [0.0]); e.g. [1, 2, 5, 10]"),
        ("stages: {llm: {levels: []}}\nCUSTOM",
         "stages.llm.levels: needs at least one level, e.g. [1, 2, 5, 10]"),
        ("CUSTOM  - {name: mine, kind: load, url: 'http://127.0.0.1:9/', levels: [1, 2, 1]}\n",
         "custom.1.levels: levels [1.0, 2.0, 1.0] repeat a level; list each once"),
        # durations and workload shapes
        ("stages: {serve: {duration: 3 parsecs}}\nCUSTOM",
         "stages.serve.duration: duration: '3 parsecs' is not a duration"),
        ("stages: {llm: {output_tokens: 'fixed:x'}}\nCUSTOM", "stages.llm: output_tokens:"),
    ],
)
def test_a_mistake_is_named_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mistake: str, line: str
) -> None:
    cfg = _config(tmp_path, mistake)
    out = tmp_path / "out"
    assert run(["diagnose", "--config", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {cfg}: {line}"), err
    # Nothing ran: no results directory, no records, and the toucher never started.
    assert not out.exists()
    assert not (tmp_path / MARK).exists()


def test_the_same_config_without_its_mistake_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The control: the marker does appear when the config is right, so its absence above
    # means the check came first.
    cfg = _config(tmp_path, "CUSTOM")
    assert run(["diagnose", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / MARK).read_text() == "1"
