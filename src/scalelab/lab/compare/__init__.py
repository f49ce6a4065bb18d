"""`scalelab compare A B`: is B better than A, per stage, level and metric, at a stated
confidence and margin (sides.py: what is compared; intervals.py: the statistics;
comparison.py: the decisions; table.py: the table as Markdown, HTML, CSV and a figure)."""
