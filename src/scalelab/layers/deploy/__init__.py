"""Kubernetes manifests as files: the layer every `deploy` command writes through.

A layer below the parts (like `lineage/` and `plan/`): the server's Deployment/HPA, the load
generator's Dask cluster and the training job build their own objects and share here how a name
is checked and how objects become YAML, so they cannot drift.
"""
