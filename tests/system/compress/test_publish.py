import json
from pathlib import Path

import torch

from scalelab.layers.lineage.store import LineageStore
from scalelab.layers.nets import registry
from scalelab.layers.nets.repository import read_json, versions
from scalelab.system.compress.publish import publish
from scalelab.system.compress.quantize import int8_variant

from .conftest import Flights


def test_publish_writes_a_loadable_version_with_manifest_and_lineage(
        flights: Flights, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "flights").mkdir(parents=True)
    cfg = repo / "flights" / "config.json"
    cfg.write_text('{"name": "flights", "mine": true}\n')  # an existing config stays as it is
    teacher = registry.load_module(flights.version)
    spec = registry.read_spec(flights.version)
    q, arch, params = int8_variant(teacher, spec["architecture"], spec["params"])
    lineage = tmp_path / "lineage.db"
    p = publish(repo, "flights", parent_dir=flights.version, module=q, arch=arch, params=params,
                technique="int8", parameters={"dtype": "qint8"}, quality={"macro_f1": 0.5},
                lineage=lineage)
    assert (p.version, p.path) == (1, repo / "flights" / "1")
    assert cfg.read_text() == '{"name": "flights", "mine": true}\n'
    m = read_json(p.path / "manifest.json")
    assert m["technique"] == "int8" and m["parameters"] == {"dtype": "qint8"}
    assert m["quality"] == {"macro_f1": 0.5}
    assert m["parent"]["version"] == "1" and len(m["parent"]["digest"]) == 64
    assert json.loads((p.path / "preprocess.json").read_text()) == json.loads(
        (flights.version / "preprocess.json").read_text())
    loaded = registry.load_module(p.path)
    c, x = torch.zeros((2, 4), dtype=torch.long), torch.zeros((2, 14))
    with torch.inference_mode():
        assert torch.equal(loaded(c, x), q(c, x))
    store = LineageStore(lineage)
    nodes = {n.id: n for n in store.nodes()}
    assert p.lineage_node in nodes and nodes[p.lineage_node].kind == "model"
    assert len(store.edges()) == 1 and store.edges()[0][1] == p.lineage_node
    p2 = publish(repo, "flights", parent_dir=flights.version, module=teacher,
                 arch=spec["architecture"], params=spec["params"], technique="copy",
                 parameters={}, quality={}, record_lineage=False)
    assert p2.version == 2 and p2.lineage_node is None
    assert versions(repo, "flights") == [1, 2]
    assert not [d for d in (repo / "flights").iterdir() if d.name.startswith(".")]


def test_missing_config_is_copied_from_the_parent(flights: Flights, tmp_path: Path) -> None:
    teacher = registry.load_module(flights.version)
    spec = registry.read_spec(flights.version)
    p = publish(tmp_path, "flights", parent_dir=flights.version, module=teacher,
                arch=spec["architecture"], params=spec["params"], technique="copy",
                parameters={}, quality={}, record_lineage=False)
    assert (tmp_path / "flights" / "config.json").read_bytes() == (
        flights.repo / "flights" / "config.json").read_bytes()
    assert p.version == 1
