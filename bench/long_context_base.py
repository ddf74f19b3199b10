"""What the parts of ``bench.long_context`` share: the lengths, the model, the memory probes, and how
rows measured in separate runs are merged and labelled."""

from __future__ import annotations

import os
import re

import torch

from longmoe.model import LongMoE
from longmoe.presets import preset

K = 1024
DECODE_LENGTHS = [4 * K, 16 * K, 64 * K, 256 * K, 1024 * K]
PREFILL_LENGTHS = [4 * K, 16 * K, 64 * K]
CHUNK = 4096


def tiny_model(seed: int = 0) -> LongMoE:
    """The ``tiny`` preset, random weights, fp32 (what the engine runs on a CPU)."""
    torch.manual_seed(seed)
    model = LongMoE(preset("tiny"))
    return model.float().eval()


def hwm_reset() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1)) * 1024


def load() -> float:
    return os.getloadavg()[0]


def merge_rows(old: dict, new: dict, lengths: list[int], prov: dict) -> dict:
    """``new`` rows over ``old``'s rows of other lengths, by length: a long prompt runs alone (one
    sample), so the shorter lengths' rounds stay. Each row carries the provenance of the run that measured
    it (a kept row without one takes its old part's)."""
    kept = {k: {"provenance": old.get("provenance"), **v} for k, v in old.get("rows", {}).items()}
    stamped = {k: {**v, "provenance": prov} for k, v in new.items()}
    rows = {**{k: v for k, v in kept.items() if int(k) not in lengths}, **stamped}
    return dict(sorted(rows.items(), key=lambda kv: int(kv[0])))


def run_label(row: dict, part: dict) -> str:
    """Which run measured a row (rows of one table may come from separate runs, at other thread counts):
    commit and date."""
    p = row.get("provenance") or part.get("provenance") or {}
    return f"{p['commit']}, {p['date']}" if p else "not recorded"
