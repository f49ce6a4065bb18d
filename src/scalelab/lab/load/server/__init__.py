"""The server's side of a load level for endpoints scalelab did not start: its /metrics (the
standard process metrics and the engines' own), its local process tree, a Prometheus server,
read around each level into the record's typed `ServerSignals` (core/signals.py)."""
