"""Constants shared by the online tests."""

START, END = "2013-01-01T00", "2013-01-08T00"
"""One week of flights (6,000-odd events): enough for batches, windows and a fine-tune."""
