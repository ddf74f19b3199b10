"""The on-disk store of precompiled decode steps (serve/precompiled.py): its key changes with everything
the traced step depends on and with nothing else, an unreadable file is moved aside (never a crash),
and old files are pruned."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from longmoe.serve import precompiled
from longmoe.serve.precompiled import PrecompiledStore, artifact_key
from tests.helpers.models import tiny_model

SMALL = {"n_layers": 2, "layer_pattern": "LM", "attn_res_blocks": 2}
KIND = "decode B=1"


def _key(model, backend="inductor", options="gemv=True", kind=KIND) -> str:
    return artifact_key(model, backend, options, kind)


def test_key_ignores_weight_values_but_not_shapes_dtype_or_config():
    a, b = tiny_model(0, **SMALL), tiny_model(1, **SMALL)
    assert _key(a) == _key(b)  # weights are the step's inputs
    assert _key(a) != _key(tiny_model(0, n_layers=3, layer_pattern="LLM", attn_res_blocks=3))
    assert _key(a) != _key(tiny_model(0, **SMALL).to(torch.bfloat16))
    assert _key(a) != _key(tiny_model(0, **SMALL, vocab_size=640))


def test_key_changes_with_backend_options_kind_and_sources(monkeypatch):
    m = tiny_model(0, **SMALL)
    keys = {_key(m), _key(m, backend="aot_eager"), _key(m, options="gemv=False"), _key(m, kind="decode B>=2")}
    assert len(keys) == 4
    before = _key(m)
    monkeypatch.setattr(precompiled, "source_digest", lambda: "edited")
    assert _key(m) != before  # an edit to the package's code invalidates every saved step


def test_source_digest_changes_with_any_python_file_and_only_those(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "layer.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("a")
    before = precompiled.tree_digest(tmp_path)
    (tmp_path / "notes.md").write_text("b")
    assert precompiled.tree_digest(tmp_path) == before
    (tmp_path / "sub" / "layer.py").write_text("x = 2\n")
    assert precompiled.tree_digest(tmp_path) != before
    assert precompiled.source_digest() == precompiled.tree_digest(Path(precompiled.__file__).parents[1])


def test_unreadable_artifact_is_moved_aside_not_raised(tmp_path, caplog):
    store = PrecompiledStore(tmp_path)
    path = store.path("k" * 32)
    path.write_bytes(b"not a compiled function")
    with caplog.at_level("WARNING", logger=precompiled.__name__):
        assert store.load("k" * 32, tiny_model(0, **SMALL)) is None
    assert not path.exists() and path.with_suffix(".bad").exists()
    assert "unreadable" in caplog.text


def test_missing_artifact_is_none(tmp_path):
    assert PrecompiledStore(tmp_path / "absent").load("0" * 32, tiny_model(0, **SMALL)) is None


def test_prune_keeps_the_most_recently_used(tmp_path):
    store = PrecompiledStore(tmp_path)
    for i in range(5):
        p = store.path(f"{i:032d}")
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    (tmp_path / "old.bad").write_bytes(b"x")
    store.prune(keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.path(f"{i:032d}").name for i in (3, 4)]


def test_unsavable_step_is_logged_not_raised(tmp_path, caplog):
    class Unsavable:
        def save_compiled_function(self, path, external_data=None):
            raise RuntimeError("cannot pickle")

    with caplog.at_level("WARNING", logger=precompiled.__name__):
        assert PrecompiledStore(tmp_path).save("1" * 32, Unsavable(), tiny_model(0, **SMALL)) is None
    assert "not saved" in caplog.text
