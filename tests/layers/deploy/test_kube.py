"""The manifest helpers every `deploy` command writes through (server, load-job, train-job)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.deploy.kube import app_labels, check_name, resources, write_manifests


@pytest.mark.parametrize("name", ["a", "scalelab-load", "x1-y2", "a" * 13])
def test_dns_labels_pass(name: str) -> None:
    check_name(name, most=13)


@pytest.mark.parametrize("name", ["", "Upper", "1abc", "under_score", "dot.ted", "a" * 14])
def test_other_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(BadUsageError, match=r"lowercase DNS label \(letters, digits, '-'; at "
                                            r"most 13\)"):
        check_name(name, most=13)


def test_a_list_is_a_multi_document_file_and_shared_objects_are_copied(tmp_path: Path) -> None:
    shared = {"app": "x"}
    files = {"one.yaml": {"kind": "Service", "labels": shared, "again": shared},
             "many.yaml": [{"kind": "Deployment", "labels": shared}, {"kind": "Service"}]}
    paths = write_manifests(files, tmp_path / "out")
    assert paths == [tmp_path / "out" / "one.yaml", tmp_path / "out" / "many.yaml"]
    one = paths[0].read_text(encoding="utf-8")
    # No YAML anchors or aliases: kubectl reads them, but people and some tools do not.
    assert "&" not in one and "*" not in one
    assert yaml.safe_load(one) == {"kind": "Service", "labels": {"app": "x"},
                                   "again": {"app": "x"}}
    docs = list(yaml.safe_load_all(paths[1].read_text(encoding="utf-8")))
    assert docs == [{"kind": "Deployment", "labels": {"app": "x"}}, {"kind": "Service"}]


def test_labels_name_the_job_and_the_component_where_there_is_one() -> None:
    assert list(app_labels("s").items()) == [("app.kubernetes.io/name", "s"),
                                             ("app.kubernetes.io/part-of", "scalelab")]
    assert list(app_labels("l", "worker").items()) == [
        ("app.kubernetes.io/name", "l"), ("app.kubernetes.io/component", "worker"),
        ("app.kubernetes.io/part-of", "scalelab")]


def test_memory_is_always_limited_and_cpu_only_when_asked() -> None:
    assert resources("1", "1Gi") == {"requests": {"cpu": "1", "memory": "1Gi"},
                                     "limits": {"memory": "1Gi"}}
    assert resources("2", "4Gi", cpu_limit=True) == {"requests": {"cpu": "2", "memory": "4Gi"},
                                                     "limits": {"cpu": "2", "memory": "4Gi"}}
