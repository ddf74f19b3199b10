"""The test tree keeps one helper home: no test file edits ``sys.path`` (helpers are imported as
``tests.helpers.<module>``), and the test-only tokenizer stays out of the package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop)\b|\[[^\]]*\]\s*=|\+=|=)")


def test_no_test_file_edits_sys_path():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*.py")
        if p != Path(__file__).resolve() and SYS_PATH_EDIT.search(p.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"edit sys.path nowhere in tests/ (import tests.helpers instead): {offenders}"


def test_package_does_not_define_the_test_tokenizer():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "longmoe").rglob("*.py")
        if re.search(r"\bdef tokenizer_for_tests\b", p.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"tokenizer_for_tests belongs in tests/helpers/tokenizer.py: {offenders}"
