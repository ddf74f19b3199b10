"""Fast-serving options of the engine: ``quantize`` (weight-only int8/int4) and ``compile``
(torch.compile'd decode/prefill steps; serve/compiled.py): decoding works through the engine, compiled
greedy tokens are identical to eager ones, and the number of compilations stays bounded as contexts
grow and the batch changes (dynamo's counters), so a recompile per token cannot creep in silently."""

from __future__ import annotations

import pytest
import torch

from longmoe.cli import main
from longmoe.quantize import weight_bytes
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams
from tests.helpers.models import tiny_model

PROMPTS = ["import os", "class Foo(object):\n    def", "x = [1, 2, 3]\nfor"]
# different lengths: the batch shrinks 3 -> 2 -> 1 as requests finish, and the contexts cross the
# first latent-capacity bucket (64 tokens) while decoding
MAX_TOKENS = [70, 40, 12]
# graphs compiled by the run below: decode at B = 1 and at B >= 2 (batch and latent capacity marked
# symbolic before the first compile; prefill runs eagerly). The bound has no slack: a recompile fails.
MAX_GRAPHS = 2


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(make_engine):
    """``engine(small=False, **fields)``: the tiny model (``SMALL``: two layers), 16-token chunks."""
    return lambda small=False, **kw: make_engine(
        tiny_model(**SMALL) if small else tiny_model(), prefill_chunk=16, **kw
    )


def _tokens(e: Engine) -> list[list[int]]:
    with e:
        outs = e.generate_batch(PROMPTS, [_params(n) for n in MAX_TOKENS])
    return [c.token_ids for c in outs]


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_engine_decodes_and_weights_shrink(engine, mode):
    """A quantized engine decodes whole requests, batched like solo, and holds fewer weight bytes."""
    full = weight_bytes(tiny_model())["total"]
    e = engine(quantize=mode)
    assert e.model.quantization == mode
    assert weight_bytes(e.model)["total"] < (0.5 if mode == "int8" else 0.4) * full
    batched = _tokens(e)
    assert [len(t) for t in batched] == MAX_TOKENS
    with engine(quantize=mode) as solo:
        assert solo.generate(PROMPTS[2], _params(MAX_TOKENS[2])).token_ids == batched[2]
    with pytest.raises(ValueError, match="quantize: expected None or one of"):
        EngineConfig(quantize="int3")


def test_generate_cli_quantize_and_compile_flags(model_dir, capsys):
    rc = main(["generate", "--model", str(model_dir), "--quantize", "int8", "def f(", "--max-tokens", "3"])
    assert rc == 0
    assert main(["generate", "--model", str(model_dir), "--quantize", "fp8", "x"]) == 2  # a usage error
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    from longmoe.cli import build_parser

    args = build_parser("serve").parse_args(["serve", "--model", "m", "--compile", "--quantize", "int4"])
    assert args.compile and args.quantize == "int4"


# compile tests: one KDA layer (dense FFN) and one MLA layer (MoE FFN) cover every static-shape path
# at a quarter of the preset's tracing time
SMALL = {"n_layers": 2, "layer_pattern": "LM", "attn_res_blocks": 2}
MORE_PROMPTS = ["def main(argv):\n    return", "while True:", "print('hello, world')", "y = x * 2"]


def _compiled_engine(engine, backend: str) -> Engine:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    e = engine(small=True)
    e.compiled = CompiledSteps(e.model, backend=backend)
    return e


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compiled_tokens_identical_and_recompiles_bounded(engine):
    """Dynamo capture (eager backend: the graphs and guards of --compile without inductor's C++ build):
    identical greedy tokens; a bounded number of graphs; and a second round of requests (new prompt
    lengths, batch sizes 1-4, contexts past a capacity bucket) compiles nothing new."""
    eager = _tokens(engine(small=True))
    e = _compiled_engine(engine, "eager")
    first = e.generate_batch(PROMPTS, [_params(n) for n in MAX_TOKENS])
    assert [c.token_ids for c in first] == eager
    n_graphs = _graphs()
    assert 0 < n_graphs <= MAX_GRAPHS, dict(torch._dynamo.utils.counters["stats"])
    # (decode is compiled with fullgraph=True: a graph break there is an error, not a silent slowdown)
    with e:
        e.generate_batch(MORE_PROMPTS, [_params(n) for n in (90, 30, 20, 5)])
    assert _graphs() == n_graphs, "a shape seen before was compiled again"


@pytest.mark.slow(wall="not measured; an inductor compile, minutes on 2 cores")
def test_compiled_inductor_tokens_identical(engine):
    """The real thing (inductor, C++ kernels) on the full run: identical greedy tokens (the fast check
    is tests/serve/test_serve_compiled.py)."""
    eager = _tokens(engine(small=True))
    e = _compiled_engine(engine, "inductor")
    assert _tokens(e) == eager
    assert e.compiled is not None and e.compiled.compile_seconds > 0


@pytest.mark.slow(wall="not measured")
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_compiled_quantized_tokens_identical(engine, mode):
    """--compile with --quantize: the quantized experts run eagerly between compiled pieces (their
    host loop is excluded from tracing), same greedy tokens as the quantized eager engine."""
    with engine(small=True, quantize=mode) as ref:
        want = ref.generate(PROMPTS[0], _params(20)).token_ids
    e = engine(small=True, quantize=mode)
    e.compiled = CompiledSteps(e.model, backend="eager")
    with e:
        assert e.generate(PROMPTS[0], _params(20)).token_ids == want
