"""Canary, shadow, promotion and rollback against the running server (model "routed")."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from serve_client import fire, wait_for
from serve_fixtures import Server, infer_body, predict, sample_inputs, write_holdout

from scalelab.cli import run
from scalelab.system.serve.canary import Routing, choose, start_candidate, write_routing


def routing(server: Server) -> dict[str, object]:
    return httpx.get(f"{server.url}/v2/models/routed/routing").json()  # type: ignore[no-any-return]


def reset(server: Server, repo: Path) -> None:
    write_routing(repo, "routed", Routing(current=1))
    wait_for(lambda: routing(server)["routing"] == {  # type: ignore[comparison-overlap]
        "current": 1, "candidate": None, "mode": "none", "weight": 0.0, "seed": 0,
        "previous": None}, "routing reset")


def versions_served(server: Server, n: int, prefix: str) -> list[str]:
    rs = fire(f"{server.url}/v2/models/routed/infer", n, lambda i: infer_body(1, seed=i),
              headers=lambda i: {"X-Request-Id": f"{prefix}{i}"})
    assert all(r.status_code == 200 for r in rs)
    return [r.json()["model_version"] for r in rs]


def test_canary_split_is_weighted_and_deterministic(server: Server, repo: Path) -> None:
    reset(server, repo)
    r = start_candidate(repo, "routed", 2, mode="canary", weight=0.3, seed=7)
    wait_for(lambda: routing(server)["routing"]["mode"] == "canary", "canary")  # type: ignore[index]
    got = versions_served(server, 40, "c")
    want = [str(choose(r, f"c{i}", 1)) for i in range(40)]
    assert got == want
    assert 0 < want.count("2") < 40
    assert versions_served(server, 40, "c") == got  # same ids, same versions
    # an explicit version bypasses the split
    rv = httpx.post(f"{server.url}/v2/models/routed/versions/1/infer", json=infer_body(1))
    assert rv.json()["model_version"] == "1"


def test_shadow_mirrors_and_records_disagreement(server: Server, repo: Path) -> None:
    reset(server, repo)
    start_candidate(repo, "routed", 2, mode="shadow", weight=0.0)
    wait_for(lambda: routing(server)["routing"]["mode"] == "shadow", "shadow")  # type: ignore[index]
    before = routing(server)["shadow"]
    rs = fire(f"{server.url}/v2/models/routed/infer", 20, lambda i: infer_body(1, seed=300 + i))
    assert {r.json()["model_version"] for r in rs} == {"1"}
    wait_for(lambda: routing(server)["shadow"]["compared"] - before["compared"] == 20,  # type: ignore[index, operator]
             "20 shadow comparisons")
    disagreed = 0
    for i in range(20):
        cat, num = sample_inputs(1, seed=300 + i)
        disagreed += int(predict(repo, "routed", 1, cat, num)[0]
                         != predict(repo, "routed", 2, cat, num)[0])
    after = routing(server)["shadow"]
    assert after["disagreed"] - before["disagreed"] == disagreed  # type: ignore[index, operator]


def test_promote_refuses_worse_accepts_better_and_rollback_restores(
        server: Server, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reset(server, repo)
    base = ["--model-repo", str(repo), "--model", "routed"]
    worse = write_holdout(tmp_path / "v1_perfect.parquet", repo, "routed", 1)
    rc = run(["serve", "promote", *base, "--candidate", "2", "--holdout", str(worse), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["accepted"] is False and doc["current"]["accuracy"] == 1.0
    assert any("accuracy" in r for r in doc["reasons"])
    assert json.loads((repo / "routed" / "serving.json").read_text())["current"] == 1

    better = write_holdout(tmp_path / "v2_perfect.parquet", repo, "routed", 2)
    rc = run(["serve", "promote", *base, "--candidate", "2", "--holdout", str(better), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["accepted"] is True and doc["candidate"]["accuracy"] == 1.0
    wait_for(lambda: routing(server)["routing"]["current"] == 2, "promotion")  # type: ignore[index]
    assert set(versions_served(server, 5, "p")) == {"2"}

    assert run(["serve", "rollback", *base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["routing"]["current"] == 1
    wait_for(lambda: routing(server)["routing"]["current"] == 1, "rollback")  # type: ignore[index]
    assert set(versions_served(server, 5, "q")) == {"1"}


def test_rollback_stops_a_canary_at_once(server: Server, repo: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    reset(server, repo)
    base = ["--model-repo", str(repo), "--model", "routed"]
    assert run(["serve", "canary", *base, "--candidate", "2", "--weight", "1", "--json"]) == 0
    capsys.readouterr()
    wait_for(lambda: routing(server)["routing"]["mode"] == "canary", "canary")  # type: ignore[index]
    assert set(versions_served(server, 5, "w")) == {"2"}
    assert run(["serve", "rollback", *base]) == 0
    assert "stopped candidate 2" in capsys.readouterr().out
    wait_for(lambda: routing(server)["routing"]["mode"] == "none", "rollback")  # type: ignore[index]
    assert set(versions_served(server, 5, "w")) == {"1"}


def test_routing_cli_bad_input(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                               ) -> None:
    base = ["--model-repo", str(repo), "--model", "routed"]
    assert run(["serve", "promote", *base, "--candidate", "9", "--holdout", "x.parquet"]) == 2
    assert "no version 9" in capsys.readouterr().err
    assert run(["serve", "promote", *base, "--candidate", "2", "--holdout",
                str(tmp_path / "missing.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert run(["serve", "canary", *base, "--candidate", "2", "--weight", "1.5"]) == 2
    assert "weight" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert run(["serve", "promote", *base, "--candidate", "2", "--holdout", str(bad)]) == 2
    assert "Parquet" in capsys.readouterr().err
