"""The test tiers, decided by rule (tests/README.md, "Tiers"): a test is **integration** when it, a
fixture it uses, or a function of its module it calls reaches a name that starts another process, a
server or a browser (``INTEGRATION_NAMES``), or builds a ``torch.compile`` graph (``compiles``:
``torch.compile``, ``torch._dynamo``, longmoe's ``CompiledSteps``, an ``EngineConfig(compile=...)``:
dynamo traces for seconds per graph, and inductor builds C++ in a compiler process); **slow** when
marked ``@pytest.mark.slow(wall=...)``; **unit** otherwise. The rule reads the code (names in the
compiled functions), so a new test is placed without anyone marking it."""

from __future__ import annotations

import dis
import types
from collections.abc import Callable, Iterable

import pytest

# what starts a process (subprocess, multiprocessing, gloo ranks), a server (uvicorn, also in a thread)
# or a browser (Playwright's chromium)
INTEGRATION_NAMES = frozenset(
    {
        "subprocess",
        "Popen",
        "multiprocessing",
        "run_ranks",  # tests/helpers/launch.py
        "serving",  # tests/helpers/server.py
        "served",
        "serve_in_thread",
        "serve_process",  # tests/helpers/serve_proc.py: `longmoe serve` as a process
        "uvicorn",
        "sync_playwright",
        "playwright",
        "chromium_page",  # tests/helpers/browser.py: Playwright's chromium
    }
)
# what builds a torch.compile graph (``torch.compile`` itself is found by ``compiles``: the attribute
# ``compile`` of the name ``torch``, not ``re.compile``; ``compile=`` a keyword of a call)
COMPILE_NAMES = frozenset({"_dynamo", "CompiledSteps"})  # torch._dynamo; longmoe.serve.compiled
DEPTH = 4  # how far calls into the test module's own functions are followed
SLOW_WITHOUT_WALL = pytest.StashKey[list[str]]()  # set at collection by tests/conftest.py


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def compiles(code: types.CodeType) -> bool:
    """Whether ``code`` (not its nested functions) names ``torch.compile``, ``COMPILE_NAMES`` or passes
    a ``compile=`` keyword."""
    names = set(code.co_names)
    if names & COMPILE_NAMES:
        return True
    if any(isinstance(c, tuple) and "compile" in c for c in code.co_consts):  # a call's keyword names
        return True
    if not {"torch", "compile"} <= names:  # the instruction scan below only where it can find one
        return False
    prev = None
    for ins in dis.get_instructions(code):
        if ins.argval == "compile" and prev is not None and prev.argval == "torch":
            return True
        prev = ins
    return False


def reaches(fn: Callable, depth: int = DEPTH, seen: set | None = None) -> bool:
    """Whether ``fn`` (or a function of its own module it names, ``depth`` calls deep) names one of
    ``INTEGRATION_NAMES`` or ``compiles``."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    seen = set() if seen is None else seen
    if code in seen:
        return False
    seen.add(code)
    names = {n for c in _codes(code) for n in c.co_names}
    if names & INTEGRATION_NAMES or any(compiles(c) for c in _codes(code)):
        return True
    if depth == 0:
        return False
    g = getattr(fn, "__globals__", {})
    for n in names:
        f = g.get(n)
        same_module = getattr(f, "__module__", None) == fn.__module__
        if isinstance(f, types.FunctionType) and same_module and reaches(f, depth - 1, seen):
            return True
    return False


_REACHES: dict[Callable, bool] = {}  # per function: thousands of tests share their fixtures


def requested_by_name(fn: Callable) -> list[str]:
    """Fixtures ``fn`` asks for at run time, ``request.getfixturevalue("name")`` with a constant name: they
    are not in the test's fixture closure, so the rule has to look them up itself."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    if code is None or "getfixturevalue" not in code.co_names:
        return []
    return [c for c in code.co_consts if isinstance(c, str) and c.isidentifier()]


def is_integration(item: pytest.Item) -> bool:
    """A collected test's tier by the rule (its function, every fixture it uses, and the fixtures those
    request by name)."""
    fns = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        fns += [d.func for defs in info.name2fixturedefs.values() for d in defs]
        for name in {n for f in fns if f is not None for n in requested_by_name(f)}:
            fns += [d.func for d in item.session._fixturemanager.getfixturedefs(name, item) or ()]
    for f in fns:
        if f is not None and f not in _REACHES:
            _REACHES[f] = reaches(f)
    return any(f is not None and _REACHES[f] for f in fns)


def missing_wall(item: pytest.Item) -> bool:
    """A slow test that does not state its wall time (``@pytest.mark.slow(wall="~40 s ...")``)."""
    m = item.get_closest_marker("slow")
    return m is not None and not m.kwargs.get("wall")
