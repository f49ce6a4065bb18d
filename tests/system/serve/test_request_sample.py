"""The request sample rotates and stays bounded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scalelab.system.serve.request_sample import RequestSampleConfig, RequestSampler


def test_rotation_keeps_at_most_max_files(tmp_path: Path) -> None:
    s = RequestSampler(RequestSampleConfig(directory=tmp_path, max_rows=5, max_files=3))
    for i in range(10):
        s.record(request_id=f"r{i}", model="m", version=1, input_names=["x"],
                 inputs=[np.full((2, 3), i, dtype=np.float32)],
                 outputs={"label": np.array([i, i])}, pre=None)
    files = sorted(tmp_path.glob("requests-*.jsonl"))
    assert [f.name for f in files] == ["requests-2.jsonl", "requests-3.jsonl",
                                       "requests-4.jsonl"]
    rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert len(rows) == 15  # 20 rows in files of 5; the oldest file was deleted
    assert rows[0]["request_id"] == "r2" and rows[0]["row"] == 1
    assert rows[-1]["x"] == [9.0, 9.0, 9.0] and rows[-1]["out_label"] == 9
