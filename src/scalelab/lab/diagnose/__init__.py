"""`scalelab diagnose`: scale the reference system (or the user's) along its four bottlenecks.

Sits on top, like the CLI: it drives each part through its own `scalelab` command in a
subprocess (so parts stay apart, a crash stays contained, and each measurement gets a clean
process), tags and collects their records, and hands them to core (sheet, verdict) and report.
"""
