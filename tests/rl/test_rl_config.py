"""RLConfig embeds the rollout engine's EngineConfig: RL defaults for unset engine fields, the old
top-level engine fields of an existing run directory still load, and the CLI shortcuts reach it;
``tis_cap`` (default 2, off with none, off for a run written before it)."""

from __future__ import annotations

import argparse
import json

import pytest

from longmoe.config import ConfigError
from longmoe.rl.cli import add_arguments, config_from_args
from longmoe.rl.config import RLConfig, rl_engine_config


def test_engine_fields_not_given_keep_the_rl_defaults():
    cfg = RLConfig.from_dict({"engine": {"prefill_chunk": 64}})
    assert cfg.engine.prefill_chunk == 64
    assert (cfg.engine.max_batch, cfg.engine.cache_budget_bytes) == (64, 4 << 30)
    assert RLConfig().engine == rl_engine_config()


def test_an_old_run_config_with_top_level_engine_fields_loads(tmp_path):
    old = {"init": "sft/final", "max_batch": 3, "prefill_chunk": 128, "steps": 5}
    (tmp_path / "rl_config.json").write_text(json.dumps(old))
    cfg = RLConfig.load(tmp_path / "rl_config.json")
    assert (cfg.engine.max_batch, cfg.engine.prefill_chunk, cfg.steps) == (3, 128, 5)
    cfg.save(tmp_path / "new.json")
    assert RLConfig.load(tmp_path / "new.json") == cfg  # the new format round-trips


def test_the_engine_context_fits_an_episode_unless_set():
    assert RLConfig(max_episode_tokens=300).engine_config().max_context == 301
    cfg = RLConfig.from_dict({"max_episode_tokens": 300, "engine": {"max_context": 4096}})
    assert cfg.engine_config().max_context == 4096


def test_a_bad_engine_field_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.json: max_batch: expected an integer >= 1, got 0"):
        RLConfig.from_dict({"engine": {"max_batch": 0}}, where="rl.json")
    with pytest.raises(ConfigError, match=r"unknown config field\(s\) \['engine.bogus'\]"):
        RLConfig.from_dict({"engine": {"bogus": 1}})


def test_cli_engine_flags_override_the_config_file(tmp_path):
    (tmp_path / "rl.json").write_text(json.dumps({"engine": {"max_batch": 5, "prefill_chunk": 32}}))
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([str(tmp_path / "run"), "--config", str(tmp_path / "rl.json"), "--max-batch", "2"])
    cfg = config_from_args(args)
    assert (cfg.engine.max_batch, cfg.engine.prefill_chunk) == (2, 32)


def test_tis_cap_defaults_to_2_is_validated_and_the_cli_turns_it_off(tmp_path):
    assert RLConfig().tis_cap == 2.0 and RLConfig(tis_cap=None).tis_cap is None
    with pytest.raises(ConfigError, match="tis_cap"):
        RLConfig(tis_cap=0.5)
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert config_from_args(p.parse_args([str(tmp_path / "r"), "--tis-cap", "3"])).tis_cap == 3.0
    assert config_from_args(p.parse_args([str(tmp_path / "r"), "--tis-cap", "none"])).tis_cap is None


def test_a_run_config_written_before_tis_loads_with_it_off(tmp_path):
    (tmp_path / "rl_config.json").write_text(json.dumps({"init": "sft/final", "steps": 5}))
    assert RLConfig.load(tmp_path / "rl_config.json").tis_cap is None
    RLConfig(tis_cap=4.0).save(tmp_path / "new.json")
    assert RLConfig.load(tmp_path / "new.json").tis_cap == 4.0
