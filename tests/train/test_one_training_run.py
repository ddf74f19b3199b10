"""One training-run capability, checked on the source: one AdamW construction, no branch on the
parallel layout in a training loop, one place each that joins the process group, checks memory,
decides a resume and writes a checkpoint's state file; the train command imports only the trainer
from the trainer module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import longmoe

PKG = Path(longmoe.__file__).parent
LOOPS = [
    "train/pretrain.py", "train/sft.py", "train/distill.py", "rl/trainer.py",
    "pipelines/mqar/run.py", "pipelines/vision_extract/train.py",
]  # fmt: skip


def sources() -> dict[str, str]:
    return {str(p.relative_to(PKG)): p.read_text() for p in PKG.rglob("*.py")}


def calls(name: str) -> list[str]:
    """Files (relative to the package) that call ``name(`` (its ``def`` does not count)."""
    pat = re.compile(rf"(?<![\w.]){re.escape(name)}\(|\.{re.escape(name)}\(")
    return sorted(f for f, text in sources().items() if pat.search(re.sub(rf"def {name}\(", "", text)))


def test_exactly_one_adamw_construction_in_the_package():
    assert calls("AdamW") == ["train/optim.py"]
    assert sources()["train/optim.py"].count("AdamW(") == 1


def test_no_training_loop_branches_on_the_parallel_layout():
    for f in LOOPS:
        text = sources()[f]
        assert ".enabled" not in text, f
        assert "torch.distributed" not in text and "is_distributed" not in text, f


def test_one_place_joins_the_process_group_checks_memory_and_decides_resume():
    assert calls("init_distributed") == ["train/parallel.py"]
    assert calls("check_memory") == ["train/run.py"]
    src = sources()
    resume_tests = [f for f, t in src.items() if re.search(r"resume and \(", t) and f != "train/run.py"]
    assert resume_tests == [], resume_tests  # every trainer and command asks train.run.is_resumed
    assert "def config_differences" in src["train/run.py"]
    assert not [f for f, t in src.items() if "def config_differences" in t and f != "train/run.py"]


def test_the_state_file_is_written_in_one_module_pair():
    """``trainer_state.pt`` is written by ``longmoe.checkpoint`` (one process) and its DCP twin only;
    no loop keeps a checkpoint format of its own (``ckpt.pt`` is read for old runs only)."""
    src = sources()
    writers = sorted(f for f, t in src.items() if re.search(r"torch\.save\([^)]*STATE_FILE", t))
    assert writers == ["checkpoint.py", "distributed/checkpoint.py"]
    for f in LOOPS:
        assert "torch.save(" not in src[f] or f == "train/sft.py", f  # SFT: its drift reference, once


def test_the_train_command_imports_only_the_trainer_from_the_trainer_module():
    tree = ast.parse(sources()["train/cli.py"])
    names = [
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "longmoe.train.pretrain"
        for a in n.names
    ]
    assert names == ["Trainer"]
