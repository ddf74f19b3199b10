"""Engine flags are generated from ``EngineConfig`` (serve/cli/options.py): every field has a flag
whose default is the field's and whose help is the field's comment, so a default exists once; the
flags parse back to the same config."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from longmoe.serve.cli.options import FLAG_UNITS, add_engine_arguments, engine_config_from_args
from longmoe.serve.engine_config import EngineConfig
from longmoe.serve.runner import ModelRunner


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_engine_arguments(p)
    return p


def test_every_field_has_a_flag_with_its_default_and_help():
    p = parser()
    by_dest = {a.dest: a for a in p._actions}
    for f in dataclasses.fields(EngineConfig):
        a = by_dest[f.name]
        assert a.help and a.help != f.name and "default" in a.help, f.name
        unit = FLAG_UNITS.get(f.name, ("", 1))[1]
        want = f.default if unit == 1 else f.default / unit
        assert a.default == want, f.name
    assert engine_config_from_args(p.parse_args(["--model", "m"])) == EngineConfig()


def test_flags_parse_to_the_config():
    args = parser().parse_args(
        ["--model", "m", "--max-batch", "3", "--no-prefix-cache", "--compile", "--cache-budget-mb", "2"]
        + ["--max-image-kb", "8", "--quantize", "int8", "--max-context", "99"]
    )
    cfg = engine_config_from_args(args)
    assert (cfg.max_batch, cfg.prefix_cache, cfg.compile) == (3, False, True)
    assert (cfg.cache_budget_bytes, cfg.max_image_bytes, cfg.quantize, cfg.max_context) == (
        2 << 20,
        8192,
        "int8",
        99,
    )
    with pytest.raises(ValueError, match="max_batch"):
        engine_config_from_args(parser().parse_args(["--model", "m", "--max-batch", "0"]))


def test_the_runner_restates_no_engine_default():
    sig = inspect.signature(ModelRunner.__init__)
    assert sig.parameters["num_speculative_tokens"].default is inspect.Parameter.empty
