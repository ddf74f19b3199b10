"""Structured outputs in ``bench/serve.py``: decode ms/token with a JSON-schema grammar vs the same
engine sampling unconstrained, in the same run (interleaved rounds), and the grammar's compile time.

The schema asks for one long string (``minLength``) so the document cannot close within the timed
tokens; both arms sample at temperature 1 with a seed (the grammar path is never the greedy fast path).
"""

from __future__ import annotations

import statistics
import time

from bench.common import range_cell, spread
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.structured import JsonFormat, JsonGrammars

SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 4000}},
    "required": ["text"],
    "additionalProperties": False,
}


def _decode_ms(engine: Engine, params: SamplingParams, prompt: list[int]) -> float:
    h = engine.submit(prompt, params)
    stamps = [time.perf_counter() for _ in h.events()]
    gaps = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]  # after the first token
    return statistics.median(gaps) * 1e3


def structured_rows(engine: Engine, prompt: list[int], n: int, rounds: int = 3) -> tuple[dict, list[list]]:
    """(results, table rows): median decode ms/token of ``n`` tokens each way, median over ``rounds``
    alternating rounds; the overhead is the per-round ratio's median (``overhead_range``: [min, max])."""
    t0 = time.perf_counter()
    grammars = JsonGrammars(engine.tokenizer, engine.vocab_size)
    setup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    factory = grammars.constraint(JsonFormat(SCHEMA))
    compile_ms = (time.perf_counter() - t0) * 1e3
    free = SamplingParams(max_tokens=n + 2, temperature=1.0, seed=0, ignore_eos=True)
    constrained = SamplingParams(
        max_tokens=n + 2, temperature=1.0, seed=0, ignore_eos=True, constraint=factory
    )
    ms_free, ms_json = [], []
    for _ in range(rounds):
        ms_free.append(_decode_ms(engine, free, prompt))
        ms_json.append(_decode_ms(engine, constrained, prompt))
    a, b = statistics.median(ms_free), statistics.median(ms_json)
    over = spread([j / f for f, j in zip(ms_free, ms_json, strict=True)])
    per = [{"unconstrained_ms": f, "json_schema_ms": j} for f, j in zip(ms_free, ms_json, strict=True)]
    res = {"unconstrained_ms": a, "json_schema_ms": b, "overhead": over["median"], "overhead_range": over,
           "rounds": per, "compile_ms": compile_ms, "tokenizer_info_ms": setup_ms}  # fmt: skip
    free_s, json_s = range_cell(spread(ms_free), ".3g"), range_cell(spread(ms_json), ".3g")
    rows = [
        [f"decode ms/token, sampled, unconstrained ({n} tokens)", free_s, "", ""],
        [f"decode ms/token, sampled, json_schema grammar ({n} tokens)", json_s, "", ""],
        ["structured / unconstrained decode, per-round", range_cell(over), "", ""],
        ["grammar setup ms (tokenizer info) / compile ms (one schema; then cached)",
         f"{setup_ms:.1f} / {compile_ms:.1f}", "", ""],
    ]  # fmt: skip
    return res, rows
