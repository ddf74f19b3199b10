"""A result names the code that made it: a dirty checkout is refused unless ``--allow-dirty`` stamps it."""

from __future__ import annotations

import subprocess

import pytest

from longmoe.report.provenance import DirtyTreeError, git_commit, peer_versions, provenance, require_clean


def _git(root, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return tmp_path


def test_a_clean_checkout_gives_its_commit(repo):
    assert require_clean(False, repo) == git_commit(repo) and "+dirty" not in git_commit(repo)


def test_a_dirty_checkout_is_refused_with_a_one_line_reason_unless_allowed(repo):
    (repo / "a.py").write_text("x = 2\n")
    with pytest.raises(DirtyTreeError, match="uncommitted changes.*--allow-dirty") as e:
        require_clean(False, repo)
    assert "\n" not in str(e.value)
    assert require_clean(True, repo).endswith("+dirty")


def test_an_untracked_file_does_not_make_a_checkout_dirty(repo):
    (repo / "notes.txt").write_text("scratch")
    assert require_clean(False, repo) == git_commit(repo)


def test_the_record_carries_every_field_and_the_peer_versions():
    rec = provenance("python -m bench.x", 0.0, commit="abc123")
    assert rec["commit"] == "abc123" and rec["command"] == "python -m bench.x"
    assert {"date", "machine", "threads", "wall_s", "cpu_s", "load_average_at_end", "peers"} <= set(rec)
    assert rec["peers"] == peer_versions() and "torch" in rec["peers"]


def test_repository_roots_are_the_checkout():
    """The reporting modules live in ``longmoe/report/``: their repository root is two folders up (after the
    move it was ``longmoe/``, and ``longmoe report`` found no ``bench/results`` by default)."""
    from longmoe.report import card, provenance

    for root in (card.ROOT, provenance.REPO):
        assert (root / "pyproject.toml").is_file() and (root / "bench" / "results").is_dir()


def test_a_benchmark_refuses_a_dirty_tree_but_its_help_works_in_any(repo):
    from bench.common import start_commit

    (repo / "a.py").write_text("x = 2\n")
    assert start_commit(["bench/kda.py", "--help"], repo) is None
    assert start_commit(["bench/kda.py", "-h"], repo) is None
    with pytest.raises(DirtyTreeError):
        start_commit(["bench/kda.py", "--rounds", "3"], repo)
    assert start_commit(["bench/kda.py"], repo, allow_dirty=True).endswith("+dirty")
