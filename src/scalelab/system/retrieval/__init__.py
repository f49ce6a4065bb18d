"""Retrieval as knowledge scaling: grow an index instead of retraining the model.

corpus (facts with ground-truth questions, seeded growth, a held-out fresh month) -> embed
(MiniLM or hashing, cached by content digest) -> index (exact numpy, faiss, hnswlib behind one
interface) -> store (manifest, sha256 check, lineage) -> retriever / server / bench.
"""
