"""The run log ``RUN/metrics.jsonl``: one JSON object per logged step or evaluation, appended as a run
goes, read back by the plots and reports, and cut back to a checkpoint's step on resume so a resumed
run's log reads as one uninterrupted run. Every trainer (pretrain, SFT, RL) writes it through here.

The file's name and place are ``longmoe.checkpoint``'s (it owns the run directory layout).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from longmoe.checkpoint import METRICS

log = logging.getLogger(__name__)


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSON-lines results file, in order; none for a missing file. A line that does not
    parse (the torn last line of a killed run) is skipped: results files are appended item by item and
    resumed from what they hold."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_metrics_lines(path: Path) -> list[str]:
    """The lines of ``metrics.jsonl`` that parse. A process killed mid-write leaves a truncated last
    line; it (and any other unreadable line) is dropped with a warning so the run can resume."""
    lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    good = []
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict):
            where = "its truncated last line" if i == len(lines) - 1 else f"unreadable line {i + 1}"
            log.warning("%s: dropping %s (a crash mid-write?)", path, where)
            continue
        good.append(ln)
    return good


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of a run's log, in order; ``FileNotFoundError`` for a directory without one."""
    f = Path(run_dir) / METRICS
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: is {run_dir} a training run directory?")
    return [json.loads(ln) for ln in read_metrics_lines(f)]


def append_metrics(run_dir: str | Path, rec: dict[str, Any]) -> None:
    """Add one record to the run's log."""
    with open(Path(run_dir) / METRICS, "a") as f:
        f.write(json.dumps(rec) + "\n")


def truncate_metrics(run_dir: str | Path, step: int) -> None:
    """Drop the records after ``step`` (and any unreadable line), so a run resumed from the checkpoint
    at ``step`` logs on as if it never stopped. A run without a log is left alone."""
    f = Path(run_dir) / METRICS
    if f.exists():
        keep = [ln for ln in read_metrics_lines(f) if json.loads(ln).get("step", 0) <= step]
        f.write_text("".join(ln + "\n" for ln in keep))
