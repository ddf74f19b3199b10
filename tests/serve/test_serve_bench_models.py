"""``bench.serve --compile-model`` names models the compile benchmark can build: each choice gives a valid
config (the ~0.3B Kimi-shaped one had called ``kimi_shapes`` with an argument it no longer takes, so the
README's compiled-decode headline could not be rerun)."""

from __future__ import annotations

import pytest

from bench import serve
from longmoe.config import ModelConfig


@pytest.mark.parametrize("name", ["tiny", "100m", "kimi300m"])
def test_every_compile_model_choice_builds_a_config(name):
    cfg = serve.compile_config(name)
    assert isinstance(cfg, ModelConfig) and cfg.max_seq_len == serve.MAX_CTX


def test_the_kimi_choice_is_the_0_3b_checkpoint_of_the_llama_cpp_comparison():
    cfg = serve.compile_config("kimi300m")
    assert (cfg.d_model, cfg.n_layers, cfg.vocab_size) == (1024, 16, 32768)
