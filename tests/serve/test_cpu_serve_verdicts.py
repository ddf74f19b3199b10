"""bench/cpu_serve.py's verdicts and peer rows: a target is met only when the whole ratio range clears it,
and llama.cpp's main rows are its users' setting (flash attention on, f16 KV), the others named."""

from __future__ import annotations

import pytest

from bench import cpu_peer, cpu_serve


@pytest.mark.parametrize(
    ("ours", "peer", "verdict"),
    [
        ([9.0, 9.5, 9.8], [10.0, 10.2, 10.5], "met"),  # every round faster
        ([9.0, 9.5, 10.6], [10.0, 10.2, 10.5], "not settled (range crosses the target)"),
        ([11.0, 11.5, 12.0], [10.0, 10.2, 10.5], "missed"),
        ([9.0, 9.5], [10.0, 10.2], "no verdict (2 sample(s))"),
    ],
)
def test_decode_target_is_met_only_when_the_ratio_range_is_wholly_below_one(ours, peer, verdict):
    r = cpu_serve.ratio_range(ours, peer)
    assert r["min"] == min(ours) / max(peer) and r["max"] == max(ours) / min(peer)
    assert cpu_serve.verdict(r["min"], r["max"], r["n"], lambda x: x <= 1.0) == verdict


def test_main_peer_rows_are_flash_attention_on_with_f16_kv_and_the_others_are_named():
    for peer in cpu_serve.PEER.values():
        _, fa, kv, where = cpu_serve.LLAMA_ARMS[peer]
        assert fa and kv == "f16" and where == "all"
        assert cpu_serve.SETTING[peer] == "flash attention on (CLI default), KV cache f16 (default)"
    assert "previous setting" in cpu_serve.SETTING["llama.cpp f32, FA off"]
    assert "KV cache f32" in cpu_serve.SETTING["llama.cpp f32, KV f32"]


def test_second_rows_run_only_where_asked():
    ctxs, second = [1024, 4096, 16384], [16384]
    at = lambda arm: [c for c in ctxs if cpu_serve.measured_at(arm, c, ctxs, second)]  # noqa: E731
    assert at("llama.cpp f32") == ctxs and at("longmoe int8 --compile") == ctxs
    assert at("llama.cpp f32, KV f32") == [16384]
    assert at("llama.cpp q8_0, FA off") == [1024, 16384]
    assert at("longmoe fp32") == [1024]


def test_the_15m_checkpoint_has_the_quoted_shape():
    k = cpu_peer.kimi_shapes("15m")
    assert (k["hidden_size"], k["num_hidden_layers"], k["num_attention_heads"], k["qk_nope_head_dim"]) == (
        256, 8, 4, 64,
    )  # fmt: skip
    assert (k["num_experts"], k["num_experts_per_tok"], k["vocab_size"]) == (16, 4, 2048)
    assert k["linear_attn_config"]["full_attn_layers"] == [4, 8]  # LLLM x2


def test_an_unknown_kv_type_is_refused_before_loading_anything():
    with pytest.raises(ValueError, match="kv: one of"):
        cpu_peer.LlamaPeer.__init__(object.__new__(cpu_peer.LlamaPeer), "x.gguf", 64, 1, kv="q4")


def test_merge_keeps_the_other_thread_counts_of_a_run_at_the_same_contexts_and_refuses_others(tmp_path):
    import json
    import types

    cfg = types.SimpleNamespace(to_dict=lambda: {"d_model": 256})
    contexts = {"decode": [1024, 16384], "prefill": [1024, 8192], "second_rows": [16384]}
    run = {"measured": {"decode": {"1024": [1.0]}, "prefill": {"8192": [2.0]}}}
    stored = {"config": {"d_model": 256}, "contexts": contexts, "runs": {"2": run, "1": run}}
    (tmp_path / "cpu_serve_15m.json").write_text(json.dumps(stored))
    kept = cpu_serve.stored_runs("cpu_serve_15m", cfg, contexts, [1], results=tmp_path)
    assert list(kept) == [2] and kept[2]["measured"]["decode"] == {1024: [1.0]}  # the 1-thread run is redone
    with pytest.raises(SystemExit, match="cpu_serve_15m.json measured another model or other contexts"):
        cpu_serve.stored_runs("cpu_serve_15m", cfg, {**contexts, "second_rows": []}, [1], results=tmp_path)
