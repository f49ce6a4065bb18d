"""`--cluster tcp://HOST:PORT`: the load commands' generators on a Dask cluster's workers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import click

from scalelab.lab.load.cluster import Cluster

cluster_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--cluster", "cluster_address", metavar="tcp://HOST:PORT",
    help="Generate from a Dask cluster: one generator a worker, each a disjoint share of the "
         "arrivals, merged exactly (start workers with `dask worker ADDRESS --nthreads 1`). "
         "Steps of a capacity search then run their full length (no early stop).")
"""Decorator: a load command takes --cluster."""


@contextlib.contextmanager
def open_cluster(address: str | None) -> Iterator[Cluster | None]:
    """The cluster named by --cluster, closed afterwards; None without it."""
    if address is None:
        yield None
        return
    with Cluster(address) as c:
        yield c
