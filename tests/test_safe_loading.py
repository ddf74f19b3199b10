"""No file a run directory holds can run code when longmoe reads it: weights and trainer state load as
data (safetensors, or ``torch.load(..., weights_only=True)``), never through a general unpickler.

A grep over the package's source, so a new loader cannot slip one in.
"""

from __future__ import annotations

import re
from pathlib import Path

import longmoe

PACKAGE = Path(longmoe.__file__).parent
UNSAFE = re.compile(r"weights_only\s*=\s*False|\bc?pickle\.loads?\b|\bdill\.loads?\b|\bmarshal\.loads?\b")
TORCH_LOAD = re.compile(r"\btorch\.load\(")


def sources() -> list[tuple[str, int, str]]:
    return [
        (str(f.relative_to(PACKAGE.parent)), i, line)
        for f in sorted(PACKAGE.rglob("*.py"))
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
    ]


def test_no_unpickling_loads_in_the_package():
    found = [f"{f}:{i}: {line.strip()}" for f, i, line in sources() if UNSAFE.search(line)]
    assert not found, (
        "loads that can run code from a file (use safetensors or weights_only=True):\n" + "\n".join(found)
    )


def test_every_torch_load_is_weights_only():
    found = [f"{f}:{i}: {line.strip()}" for f, i, line in sources() if TORCH_LOAD.search(line)]
    assert found, "the grep found no torch.load at all: is it still looking at the package?"
    unsafe = [ln for ln in found if "weights_only=True" not in ln]
    assert not unsafe, "torch.load without weights_only=True on the same line:\n" + "\n".join(unsafe)
