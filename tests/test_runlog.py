"""longmoe.runlog: the run's metrics.jsonl appends records, survives a torn last line, and is cut back
to a checkpoint's step on resume."""

from __future__ import annotations

import pytest

from longmoe.checkpoint import METRICS
from longmoe.runlog import append_metrics, read_metrics, truncate_metrics


def test_truncation_keeps_the_records_up_to_the_step_and_drops_a_torn_line(tmp_path):
    for s in (1, 2, 3):
        append_metrics(tmp_path, {"step": s, "loss": 1.0 / s})
    with open(tmp_path / METRICS, "a") as f:
        f.write('{"step": 4, "lo')  # a process killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    truncate_metrics(tmp_path, 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    append_metrics(tmp_path, {"step": 3})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_a_run_without_a_log(tmp_path):
    truncate_metrics(tmp_path, 0)  # nothing to cut
    assert not (tmp_path / METRICS).exists()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        read_metrics(tmp_path)
