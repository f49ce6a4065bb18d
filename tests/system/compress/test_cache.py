import numpy as np
import pytest
import torch

from scalelab.system.compress.cache import measure_cache, zipf_requests


def test_zipf_requests_are_skewed_and_deterministic() -> None:
    a = zipf_requests(1000, 5000, s=1.2, seed=3)
    assert np.array_equal(a, zipf_requests(1000, 5000, s=1.2, seed=3))
    assert a.min() >= 0 and a.max() < 1000
    counts = np.bincount(a, minlength=1000)
    assert counts.max() > 20 * np.median(counts[counts > 0])


def test_measure_cache_counts_hits_and_expiry() -> None:
    lin = torch.nn.Linear(3, 2)

    def model(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return lin(x)

    cat, num = torch.zeros((50, 1), dtype=torch.long), torch.randn(50, 3)
    run = measure_cache(model, cat, num, n_requests=400, zipf_s=1.3, rate_per_s=100.0,
                        ttl_s=0.5, capacity=8)
    assert run.requests == 400
    assert 0.0 < run.hit_rate < 1.0
    assert run.expired > 0 and run.evicted > 0
    long_ttl = measure_cache(model, cat, num, n_requests=400, zipf_s=1.3, rate_per_s=100.0,
                             ttl_s=1e6, capacity=1000)
    assert long_ttl.expired == 0 and long_ttl.hit_rate > run.hit_rate
    # without expiry or eviction, every request after a key's first is a hit
    keys = zipf_requests(50, 400, s=1.3, seed=0)
    assert long_ttl.hit_rate == pytest.approx(1 - len(set(keys.tolist())) / 400)
