"""``layers/shapes.py``: a compiled engine's eager prefill leaves the shape-static layout, in its own thread
only, and gets the same values."""

from __future__ import annotations

import threading

import torch

from longmoe.layers import mla as mla_mod
from longmoe.layers.shapes import dynamic_shapes, shape_static
from tests.helpers.models import tiny_model


class Flagged(torch.nn.Module):
    static_shapes = True


def test_dynamic_shapes_suspends_the_flag_in_this_thread_only():
    m, seen = Flagged(), {}
    assert shape_static(m)
    started, release = threading.Event(), threading.Event()

    def other():  # the warm-up thread that compiles the decode step while the engine prefills
        started.wait()
        seen["other"] = shape_static(m)
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with dynamic_shapes():
        seen["inside"] = shape_static(m)
        started.set()
        release.wait(10)
    t.join()
    assert seen == {"inside": False, "other": True}
    assert shape_static(m)  # restored on exit
    m.static_shapes = False
    with dynamic_shapes():
        assert not shape_static(m)


def test_a_shape_static_model_prefills_on_the_eager_paths_with_the_same_logits(monkeypatch):
    """Inside ``dynamic_shapes`` a static model's chunked prefill attends after the cached prefix (not over
    the whole reserved buffer) and routes eagerly; its logits equal the static layout's."""
    model = tiny_model()
    x = torch.randint(3, 100, (1, 48))
    calls = []
    real = mla_mod.causal_after_prefix
    monkeypatch.setattr(mla_mod, "causal_after_prefix", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    model.set_static_shapes(True)
    model.set_mla_decode("naive")  # what a long chunk of a large model picks (a 16-token tiny one absorbs)
    out = {}
    with torch.no_grad():
        for mode in ("static", "dynamic"):
            cache = model.new_cache(1)
            with dynamic_shapes() if mode == "dynamic" else torch.no_grad():
                for a in (0, 16, 32):
                    cache.reserve(x[:, a : a + 16].shape[1])
                    logits = model(x[:, a : a + 16], cache=cache, logits_to_keep=1).logits
            out[mode] = logits
    mla_layers = sum(isinstance(b.mixer, mla_mod.MLALayer) for b in model.blocks)
    assert mla_layers and sorted(calls) == sorted([0, 16, 32] * mla_layers)  # only the dynamic pass
    torch.testing.assert_close(out["dynamic"], out["static"], atol=1e-5, rtol=1e-5)


def test_another_threads_compile_does_not_restore_the_static_layout(monkeypatch):
    """``torch.compiler.is_compiling`` is a process-wide flag that dynamo holds for a whole compile (the
    warm-up thread's): with it set, an eager prefill inside ``dynamic_shapes`` still sees the flag off."""
    m = Flagged()
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    with dynamic_shapes():
        assert not shape_static(m)


def test_a_traced_step_sees_the_flag_without_a_graph_break():
    """Dynamo folds the check: a ``fullgraph`` compile of code that asks succeeds, and sees the flag."""
    m = Flagged()

    @torch.compile(backend="eager", fullgraph=True)
    def step(x):
        return x + 1 if shape_static(m) else x - 1

    assert step(torch.zeros(2)).tolist() == [1.0, 1.0]
