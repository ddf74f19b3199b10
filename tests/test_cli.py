"""The CLI entry point: `longmoe --help`, `longmoe version`, and `python -m longmoe` are one CLI."""

import subprocess
import sys

from longmoe import __version__
from longmoe.cli import main


def test_version_command(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"longmoe {__version__}"


def test_help_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "version" in out and "<command>" in out


def test_python_dash_m_is_the_same_cli():
    out = subprocess.run(
        [sys.executable, "-m", "longmoe", "version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"longmoe {__version__}"


def test_unknown_command_fails():
    r = subprocess.run([sys.executable, "-m", "longmoe", "no-such-command"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr
