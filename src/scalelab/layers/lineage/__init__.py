"""What a dataset or model is and what it came from: content-digest manifests and the lineage store.

A layer below the parts (like `nets/`): data, train, model, retrieval and online write manifests
and register lineage through it, so they agree on one digest without importing each other.
"""
