"""A user's endpoint in scalelab.yaml: its headers and key reach the load commands (the key by
the name of its variable only), and availability is among its objectives (99% by default,
said so) and goes to a custom load stage's capacity search in its --slo (`avail>=99%`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.stages.custom import _command, _search
from scalelab.lab.diagnose.stages.endpoint import DEFAULT_AVAILABILITY_LABEL
from scalelab.lab.diagnose.stages.llm import STAGE as LLM

CONFIG = """
stages:
  serve: {{url: "http://127.0.0.1:9/predict", headers: {{X-Tenant: a}}, api_key_env: SVC_KEY,
          objectives: [{{metric: p95_ms, max: 50}}]}}
  llm: {{url: "http://127.0.0.1:9", api_key_env: OPENAI_API_KEY,
        objectives: [{{metric: p95_ms, max: 900}}, {{metric: availability, min: 0.999}}]}}
custom:
  - {{name: mine, kind: load, url: "http://127.0.0.1:9/x", headers: {{X-Tenant: b}},
      api_key_env: MY_KEY, objectives: [{{metric: p95_ms, max: 50}}]}}
"""


@pytest.fixture
def cfg(tmp_path: Path) -> object:
    p = tmp_path / "scalelab.yaml"
    p.write_text(CONFIG.format())
    return load_config(p)


def test_custom_load_stage_sends_headers_and_names_the_key(cfg: object) -> None:
    (c,) = cfg.custom.root  # type: ignore[attr-defined]
    argv = _command(c, 1, Path("r.jsonl")).to_argv()
    at = argv.index("--header")
    assert argv[at:at + 2] == ["--header", "X-Tenant: b"]
    at = argv.index("--api-key-env")
    assert argv[at:at + 2] == ["--api-key-env", "MY_KEY"]


def test_custom_load_stage_judges_availability_by_default(cfg: object) -> None:
    (c,) = cfg.custom.root  # type: ignore[attr-defined]
    avail = [o for o in c.built() if o.metric == "availability"]
    assert [(o.min, o.label) for o in avail] == [(0.99, DEFAULT_AVAILABILITY_LABEL)]
    search = _search(c, Path("cap.jsonl"))
    assert search is not None
    argv = search.to_argv()
    assert argv[argv.index("--slo") + 1].endswith(",avail>=99%")
    assert "--error-budget" not in argv
    assert argv[argv.index("--api-key-env") + 1] == "MY_KEY"


def test_serve_and_llm_urls_keep_a_named_availability(cfg: object) -> None:
    serve = cfg.section("serve")  # type: ignore[attr-defined]
    assert [(o.metric, o.min) for o in serve.built_objectives()][-1] == ("availability", 0.99)
    assert serve.access() == {"header": ["X-Tenant: a"], "api_key_env": "SVC_KEY"}
    llm = cfg.section("llm")  # type: ignore[attr-defined]
    # The config's own availability objective stays the only one.
    assert [o.min for o in llm.built_objectives() if o.metric == "availability"] == [0.999]
    argv = LLM._load(llm, "http://127.0.0.1:9", Path("r"), None, None, None).to_argv()
    assert argv[argv.index("--api-key-env") + 1] == "OPENAI_API_KEY"


def test_bad_access_settings_are_refused(tmp_path: Path) -> None:
    from scalelab.lab.core.errors import BadInputError

    p = tmp_path / "scalelab.yaml"
    p.write_text('custom:\n  - {name: m, kind: load, url: "http://127.0.0.1:9/", '
                 'api_key_env: "not a name"}\n')
    with pytest.raises(BadInputError, match="api_key_env"):
        load_config(p)
