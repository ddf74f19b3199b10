"""Structured outputs: grammar-constrained sampling from a tiny random model always yields JSON that
parses and matches the schema (200 sampled outputs at temperature 1), stops when the document closes,
is cut with ``"length"`` by ``max_tokens``, and never lets a special or control token through."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench.structured import structured_rows
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.structured import JsonFormat, JsonGrammars, StructuredOutputError, token_bytes
from tests.helpers.models import tiny_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "active"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "owner": PERSON,
        "point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "owner", "point"],
    "additionalProperties": False,
}
LISTS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 5},
        "note": {"type": ["string", "null"], "maxLength": 6},
    },
    "required": ["tags", "scores", "note"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 5},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number"},
                },
                "required": ["sku", "qty", "price"],
                "additionalProperties": False,
            },
        },
        "paid": {"type": "boolean"},
    },
    "required": ["items", "paid"],
    "additionalProperties": False,
}


def validate(doc: object, schema: dict, path: str = "$") -> None:
    """A small JSON Schema validator for the subset the schemas above use; raises AssertionError."""
    if "enum" in schema:
        assert doc in schema["enum"], f"{path}: {doc!r} not in {schema['enum']}"
        return
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    kinds = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    assert any(kinds[t](doc) for t in types), f"{path}: {doc!r} is not {types}"
    if isinstance(doc, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in doc, f"{path}: missing {k}"
        if schema.get("additionalProperties") is False:
            assert set(doc) <= set(props), f"{path}: extra keys {set(doc) - set(props)}"
        for k, v in doc.items():
            if k in props:
                validate(v, props[k], f"{path}.{k}")
    elif isinstance(doc, list):
        assert schema.get("minItems", 0) <= len(doc) <= schema.get("maxItems", 10**9), (
            f"{path}: {len(doc)} items"
        )
        for i, v in enumerate(doc):
            validate(v, schema["items"], f"{path}[{i}]")
    elif isinstance(doc, str):
        assert len(doc) <= schema.get("maxLength", 10**9), f"{path}: too long"
    elif isinstance(doc, int | float) and not isinstance(doc, bool):
        assert schema.get("minimum", -float("inf")) <= doc <= schema.get("maximum", float("inf")), path


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(tiny_model(), max_batch=64)


@pytest.fixture(scope="module")
def grammars(engine):
    return JsonGrammars(engine.tokenizer, engine.vocab_size)


@pytest.mark.parametrize("schema", [PERSON, NESTED, LISTS, ITEMS], ids=["flat", "nested", "lists", "items"])
def test_sampled_outputs_always_match_schema(engine, grammars, schema):
    """50 samples per schema at temperature 1 (200 in all), batched: every one stops and validates."""
    params = SamplingParams(
        max_tokens=400, temperature=1.0, seed=7, constraint=grammars.constraint(JsonFormat(schema))
    )
    prompts = [f"record {i}:" for i in range(50)]
    outs = engine.generate_batch(prompts, [dataclasses.replace(params, seed=i) for i in range(50)])
    texts = set()
    for c in outs:
        assert c.finish_reason == "stop", (c.finish_reason, c.text)
        validate(json.loads(c.text), schema)
        texts.add(c.text)
    assert len(texts) > 15  # really sampled, not one greedy answer


def test_json_object_is_an_object(engine, grammars):
    f = grammars.constraint(JsonFormat())
    outs = engine.generate_batch(
        ["{"] * 16, [SamplingParams(max_tokens=600, seed=i, constraint=f) for i in range(16)]
    )
    stopped = [c for c in outs if c.finish_reason == "stop"]
    assert len(stopped) >= 8
    for c in stopped:
        assert isinstance(json.loads(c.text), dict)


def test_max_tokens_cuts_with_length(engine, grammars):
    f = grammars.constraint(JsonFormat(NESTED))
    c = engine.generate("x", SamplingParams(max_tokens=5, seed=0, constraint=f))
    assert c.finish_reason == "length" and c.completion_tokens == 5
    # the schema's first key is "id": 5 tokens spell a prefix of '{"id": <digits>' (whatever the split)
    assert c.text and ('{"id": '.startswith(c.text) or c.text.startswith('{"id": '))
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.text)


def test_greedy_constrained_is_deterministic_and_valid(engine, grammars):
    f = grammars.constraint(JsonFormat(PERSON))
    a = engine.generate("x", SamplingParams(max_tokens=200, temperature=0, constraint=f))
    b = engine.generate_batch(["y", "x"], SamplingParams(max_tokens=200, temperature=0, constraint=f))[1]
    assert a.text == b.text and a.finish_reason == "stop"
    validate(json.loads(a.text), PERSON)


def test_special_and_control_tokens_never_allowed(engine, grammars):
    tok = engine.tokenizer
    raw = token_bytes(tok)
    g = grammars.constraint(JsonFormat(LISTS))()

    allowed_ever = set()
    for text in ['{"tags": ["', '{"tags": ["red"], "scores": [', '{"tags": ["red"], "scores": [], "note": "']:
        g = grammars.constraint(JsonFormat(LISTS))()
        for i in tok.encode(text):
            g.accept(i)
        x = torch.zeros(engine.vocab_size)
        g.mask(x)
        allowed_ever |= set(torch.nonzero(x == 0).flatten().tolist())
    assert allowed_ever
    for i in allowed_ever:
        assert i not in tok.special_ids.values()
        assert raw[i] and all(b >= 0x20 for b in raw[i])


def test_compiled_grammars_are_cached(grammars):
    n = grammars.compiled
    a = grammars.compile(JsonFormat(dict(PERSON)))
    b = grammars.compile(JsonFormat(json.loads(json.dumps(PERSON))))
    assert a is b and grammars.compiled <= n + 1


@pytest.mark.parametrize("schema", [{"type": "frobnicate"}, {"type": "object", "properties": 5}, [1, 2]])
def test_bad_schema_names_response_format(grammars, schema):
    with pytest.raises(StructuredOutputError, match="^response_format"):
        grammars.compile(JsonFormat(schema))


def test_bench_rows(engine):
    res, rows = structured_rows(engine, [1, 40, 41], n=4, rounds=1)
    assert res["unconstrained_ms"] > 0 and res["json_schema_ms"] > 0 and len(rows) == 4


def test_torch_unpacked_mask_matches_xgrammar(engine, grammars):
    """Other devices unpack the bits with torch: the same mask as xgrammar's CPU kernel."""
    g = grammars.constraint(JsonFormat(ITEMS))()
    for i in engine.tokenizer.encode('{"items": [{"sku": "a'):
        g.accept(i)
    x = torch.zeros(engine.vocab_size)
    g.mask(x)
    allowed = g.allowed()
    assert torch.equal(allowed, x == 0) and 0 < int(allowed.sum()) < engine.vocab_size
