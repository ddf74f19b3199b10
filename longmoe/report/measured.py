"""What a result file measured: the model (or the operator alone) and its size, as a report-card headline
names it (issue 50: every headline names its model and size).

Read from the file where it records it (a model config, an operator shape, a parameter count); where it
does not, from the fixed configuration of the script that wrote it, and the text names that script. A
size the file does not record is said to be missing, never guessed.
"""

from __future__ import annotations

# the ``tiny`` preset's shapes (longmoe/presets.py, unchanged since every benchmark here ran), for files
# that do not store their config
TINY_SHAPE = "d_model 128, 8 layers LLLM, 8 experts top-2"
# bench/moe.py's fixed layer shape (D, F_HID, K, SHARED), unchanged since moe.json's run
MOE_SHAPE = "top-8, d 512, expert width 128, 1 shared expert of width 128"
# bench/packed_attention.py's heads (H, D = 2, 32: the tiny preset's MLA heads)
PACKED_HEADS = "2 heads x 32"
# VisionExtractConfig's model defaults (longmoe/pipelines/vision_extract/config.py, unchanged since the
# first vision_extract run, e447615), for result files written before the recipe stored its config
VISION_DEFAULTS = {"encoder": "conv", "patch_size": 8, "d_model": 64, "n_layers": 2, "layer_pattern": "LM"}
NO_COUNT = "parameter count not in the file"
BYTES_PER_FP32 = 4


def command_flag(d: dict, flag: str) -> str | None:
    """The value of ``flag`` in the command that wrote the file (its provenance), or None."""
    words = ((d.get("provenance") or {}).get("command") or "").split()
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def config_shape(cfg: dict) -> str:
    """A model config (``ModelConfig.to_dict()``) in a few words: width, depth, layer pattern, experts."""
    ffn = cfg.get("ffn") or {}
    moe = f", {ffn['n_experts']} experts top-{ffn['top_k']}" if ffn.get("kind") == "moe" else ""
    return f"d_model {cfg['d_model']}, {cfg['n_layers']} layers {cfg['layer_pattern']}{moe}"


def tiny_engine_model(d: dict, script: str) -> str:
    """A benchmark's random ``tiny``-preset model: its shapes from the file's config where it has one."""
    cfg = d.get("config") or {}
    shape = config_shape(cfg) if "d_model" in cfg else f"{TINY_SHAPE}; {script}, no config in the file"
    return f"tiny-preset shapes ({shape}), random weights"


def kda_model(d: dict) -> str:
    s = d.get("shape") or {}
    if not s:
        return "KDA operator alone (shape not in the file; bench/kda.py)"
    return f"KDA operator alone, B={s['B']} H={s['H']} K={s['K']} V={s['V']}, chunk {s['C']}"


def moe_model(e: int, n_tokens: int) -> str:
    return f"MoE layer alone, E = {e}, {MOE_SHAPE} (bench/moe.py), {n_tokens:,} tokens"


def packed_attention_model(row: dict) -> str:
    return (
        f"attention op alone, {PACKED_HEADS} (bench/packed_attention.py), {row['window']}-token windows "
        f"of {row['docs']}-token documents"
    )


def load_model(d: dict) -> str:
    path = command_flag(d, "--model")
    if path:
        return f"the model at {path} ({NO_COUNT})"
    return f"tiny preset ({TINY_SHAPE}) with vocab 512, untied embeddings, random weights (bench/load.py)"


def quant_model(d: dict) -> str:
    """The trained model ``bench.quant --model`` read; its size from the fp32 weight bytes."""
    what = "the demo's trained tiny hybrid MoE"
    total = ((d.get("variants") or {}).get("fp32") or {}).get("weight_bytes", {}).get("total")
    if not total:
        return f"{what}, {NO_COUNT}"
    return f"{what}, {total // BYTES_PER_FP32:,} parameters (fp32 weight bytes / 4)"


def vision_model(d: dict) -> str:
    """The image -> JSON extractor the recipe trained (its config and parameter count where recorded)."""
    cfg, params = d.get("config") or {}, (d.get("main") or {}).get("params")
    recorded = "d_model" in cfg
    c = cfg if recorded else VISION_DEFAULTS
    shape = (
        f"{c.get('encoder', 'conv')} encoder, {c['patch_size']}-px patches, decoder d_model {c['d_model']}, "
        f"{c['n_layers']} layers {c['layer_pattern']}" + ("" if recorded else ": the recipe's defaults")
    )
    return f"image → JSON extractor ({shape}), " + (f"{params:,} parameters" if params else NO_COUNT)


def agent_model(d: dict) -> str:
    """The agent recipe's model: the ``tiny`` preset (longmoe/pipelines/agent), pretrained, SFT, RL."""
    c = d.get("config") or {}
    pre = f"pretrained on {c['pretrain_tokens']:,} tokens, " if c.get("pretrain_tokens") else "pretrained, "
    return f"tiny preset ({TINY_SHAPE}; {pre}SFT then RL, longmoe/pipelines/agent), {NO_COUNT}"


def spec_model(d: dict) -> str:
    """bench.spec's target (a trained demo run, the ``tiny`` preset) and its drafts' depth."""
    drafts = f"{d['draft_layers']}-layer drafts" if d.get("draft_layers") else "drafts"
    return f"the demo's trained tiny hybrid MoE ({TINY_SHAPE}), {NO_COUNT}; trained {drafts}"


def mqar_params(d: dict, pattern: str) -> str:
    """The parameter count (or range) of the trained MQAR models of ``pattern`` the file stores."""
    return param_range(m["train"]["params"] for m in d.get("models") or [] if m["cell"]["pattern"] == pattern)


def param_range(counts) -> str:
    """Parameter counts of several trained models as one phrase: one count, a range, or ``NO_COUNT``."""
    ps = sorted({c for c in counts if c})
    if not ps:
        return NO_COUNT
    return f"{ps[0]:,} parameters" if len(ps) == 1 else f"{ps[0]:,}-{ps[-1]:,} parameters"
