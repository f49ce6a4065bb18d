"""Constants shared by the online tests."""

START, END = "2013-01-01T00", "2013-01-08T00"
"""One week of flights (6,000-odd events): enough for batches, windows and a fine-tune."""
SCHEMA_END = "2013-02-06T00"
"""The schema fixture covers 2013-01-01 up to here: every span a test replays."""
