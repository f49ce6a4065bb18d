"""The data part: generate, ingest, validate, quarantine, deduplicate, join, featurise, split.

Engines: polars on one machine (`pipeline.py`), Dask distributed futures (`dask_engine.py`);
both run the same per-partition functions, so they give the same bytes.
"""
