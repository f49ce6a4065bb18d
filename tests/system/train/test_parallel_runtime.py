"""train.parallel.runtime: the process baseline the planner adds, measured once and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalelab.lab.core.errors import RunFailedError
from scalelab.system.train.parallel.runtime import cache_key, cache_path, measure_baseline


def test_a_cached_baseline_is_read_back_per_strategy(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path))
    key = cache_key("gloo", 1, True, "fsdp", str(torch.__version__))
    entry = {"peak_rss_bytes": 123, "rss_bytes": 120, "backend": "gloo", "threads": 1,
             "deterministic": True, "strategy": "fsdp", "torch_version": "x", "python": "y",
             "host": "z"}
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text(json.dumps({key: entry}), encoding="utf-8")
    got = measure_baseline("fsdp")
    assert (got.peak_rss_bytes, got.cached) == (123, True)
    with pytest.raises(RunFailedError, match="no baseline probe for strategy 'zero'"):
        measure_baseline("zero")


@pytest.mark.slow
def test_the_probe_measures_a_torch_process_and_caches_it(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path))
    first = measure_baseline("dp", deterministic=False)
    # A process that imported torch and joined a gloo group: well over the interpreter's ~10 MiB.
    assert not first.cached and first.peak_rss_bytes >= first.rss_bytes > 100 * 2**20
    again = measure_baseline("dp", deterministic=False)
    assert again.cached and again.peak_rss_bytes == first.peak_rss_bytes
    assert len(json.loads(cache_path().read_text(encoding="utf-8"))) == 1
    # an entry of another shape (an older version's fields) is re-measured, not trusted
    key = next(iter(json.loads(cache_path().read_text(encoding="utf-8"))))
    cache_path().write_text(json.dumps({key: {"peak": 1}}), encoding="utf-8")
    third = measure_baseline("dp", deterministic=False)
    assert not third.cached and third.peak_rss_bytes > 100 * 2**20
