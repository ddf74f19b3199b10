"""``longmoe recipe``: every pipeline runs one way (the real runs are in each recipe's own tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import longmoe.pipelines
from longmoe.cli import main
from longmoe.pipelines.recipe import RECIPES


def test_list_names_every_recipe(capsys):
    assert main(["recipe", "--list"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert names == list(RECIPES)


def test_every_recipe_package_is_registered_and_documented():
    """A pipeline package that is not a recipe would be unreachable from the CLI."""
    pkgs = {p.name for p in __import__("pathlib").Path(longmoe.pipelines.__file__).parent.iterdir()
            if (p / "__init__.py").is_file()}  # fmt: skip
    assert pkgs == {name.replace("-", "_") for name in RECIPES}  # agent-long lives in agent_long
    assert all(f"``{name}``" in longmoe.pipelines.__doc__ for name in RECIPES)


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_help_works(name, capsys):
    assert main(["recipe", name, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"longmoe recipe {name}" in out and "--quick" in out and "--out" in out


def test_unknown_recipe_is_a_one_line_error(capsys):
    assert main(["recipe", "no-such-recipe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("longmoe recipe: error: unknown recipe 'no-such-recipe'")


def test_a_recipe_config_error_is_a_one_line_error(capsys):
    assert main(["recipe", "mqar", "--quick", "--patterns", "LZ", "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("longmoe recipe: error:")


def test_python_dash_m_is_an_alias():
    r = subprocess.run(
        [sys.executable, "-m", "longmoe.pipelines.ablations", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "longmoe recipe ablations" in r.stdout


def test_no_recipe_sets_a_matplotlib_backend_at_import():
    code = "import sys, longmoe.pipelines.mqar.report, longmoe.eval.plots; print('matplotlib' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_a_successful_run_records_its_provenance(tmp_path, monkeypatch):
    """`longmoe recipe NAME --out DIR` writes DIR/provenance.json (what `longmoe report` prints) after a
    run that succeeded, and nothing after one that failed."""
    import json
    import types

    from longmoe.pipelines import recipe

    fake = types.ModuleType("fake_recipe")
    fake.add_arguments = lambda p: recipe.add_common_arguments(p, out=str(tmp_path / "default"))
    fake.run = lambda args: (args.out.mkdir(parents=True, exist_ok=True), 1 if args.quick else 0)[1]
    monkeypatch.setitem(sys.modules, "fake_recipe", fake)
    monkeypatch.setitem(recipe.RECIPES, "fake", ("fake_recipe", "a test recipe"))
    assert main(["recipe", "fake", "--out", str(tmp_path / "ok")]) == 0
    p = json.loads((tmp_path / "ok" / recipe.PROVENANCE_FILE).read_text())
    assert p["command"] == f"longmoe recipe fake --out {tmp_path / 'ok'}" and p["wall_s"] >= 0
    assert set(p) == {
        "commit",
        "date",
        "machine",
        "threads",
        "command",
        "wall_s",
        "cpu_s",
        "load_average_at_end",
        "peers",
    }  # the record longmoe/report/provenance.py writes for every result
    assert main(["recipe", "fake", "--quick", "--out", str(tmp_path / "failed")]) == 1
    assert not (tmp_path / "failed" / recipe.PROVENANCE_FILE).exists()
