"""The tier rule (tests/helpers/tiers.py) places tests by what their code reaches: a process, a
server, a browser or a torch.compile graph makes a test integration, directly, through a helper of its
module, or through a fixture; anything else is unit. A slow test must state its wall time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.engine import EngineConfig
from tests.helpers.server import serving
from tests.helpers.tiers import SLOW_WITHOUT_WALL, is_integration, missing_wall, reaches


def _starts_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _calls_a_helper_that_starts_one() -> None:
    _starts_a_process()


def _serves(app) -> None:
    with serving(app):
        pass


def _pure() -> int:
    return sum(range(3))


def _torch_compiles():
    return torch.compile(_pure, backend="eager")


def _dynamo_reset() -> None:
    torch._dynamo.reset()


def _compiled_steps(model):
    return CompiledSteps(model, backend="eager")


def _compiled_engine_config():
    return EngineConfig(compile=True)


def _regex() -> bool:
    return re.compile("a+").match("aa") is not None and torch.compiler.is_compiling() is False


def _decorates():
    @torch.compile(backend="eager", fullgraph=True)
    def step(x):
        return x + 1

    return step


def test_torch_compile_graphs_are_integration():
    for fn in (_torch_compiles, _decorates, _dynamo_reset, _compiled_steps, _compiled_engine_config):
        assert reaches(fn), fn.__name__
    assert not reaches(_regex), "re.compile and torch.compiler's flags build no graph"


def test_processes_servers_and_helpers_reaching_them_are_integration():
    assert reaches(_starts_a_process)
    assert reaches(_calls_a_helper_that_starts_one)  # one call deep, through the module's own helper
    assert reaches(_serves)
    assert reaches(lambda: _serves(None))  # nested code objects are read too
    assert not reaches(_pure)


class _Item:
    """What the rule reads of a collected test: its function, the fixtures' functions, its markers."""

    def __init__(self, obj, fixtures=(), slow: dict | None = None, by_name=()) -> None:
        self.obj = obj
        defs = {f.__name__: [type("Def", (), {"func": f})()] for f in fixtures}
        self._fixtureinfo = type("Info", (), {"name2fixturedefs": defs})()
        named = {
            f.__name__: [type("Def", (), {"func": f})()] for f in by_name
        }  # the session's other fixtures
        manager = type("Manager", (), {"getfixturedefs": staticmethod(lambda name, node: named.get(name))})()
        self.session = type("Session", (), {"_fixturemanager": manager})()
        self._slow = None if slow is None else pytest.mark.slow(**slow).mark

    def get_closest_marker(self, name: str):
        return self._slow if name == "slow" else None


def test_a_fixture_that_serves_makes_its_tests_integration():
    assert is_integration(_Item(_pure, fixtures=[_serves]))
    assert not is_integration(_Item(_pure, fixtures=[_pure]))


def _asks_for_the_server_by_name(request):
    return request.getfixturevalue("_serves")


def test_a_fixture_requested_by_name_that_serves_makes_its_tests_integration():
    # e.g. tests/serve/files/test_store.py: the [s3] store asks for the moto server with getfixturevalue
    assert is_integration(_Item(_pure, fixtures=[_asks_for_the_server_by_name], by_name=[_serves, _pure]))
    assert not is_integration(_Item(_pure, fixtures=[_asks_for_the_server_by_name], by_name=[_pure]))


def test_slow_tests_state_their_wall_time():
    assert missing_wall(_Item(_pure, slow={}))
    assert not missing_wall(_Item(_pure, slow={"wall": "~40 s on 2 shared cores"}))
    assert not missing_wall(_Item(_pure))


def test_this_module_is_placed_by_the_rule(request):
    # it imports subprocess and serving but this test reaches neither: unit
    assert request.node.get_closest_marker("integration") is None


def test_every_collected_slow_test_states_its_wall_time(request):
    bad = request.config.stash.get(SLOW_WITHOUT_WALL, [])
    assert not bad, f'@pytest.mark.slow needs wall="<measured time>": {bad}'
