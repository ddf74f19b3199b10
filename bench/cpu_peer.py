"""The CPU side-by-side's model and its llama.cpp peer: a Kimi-Linear checkpoint built once in
transformers' format, imported with ``longmoe convert --from-hf``, exported with ``--to-gguf``.

Random weights (speed only). Three sizes (``SIZES``):

- ``0.3b``: the ``small`` preset's shapes in Kimi-Linear's options (d 1024, 16 layers KDA:MLA 3:1, 8 heads
  of 128, NoPE MLA with kv rank 256 and no q rank, first layer dense 2816, 16 experts top-2 of width 192 +
  1 shared, vocab 32768; ~0.3B total);
- ``15m``: d 256, 8 layers (LLLM x2), 4 heads of 64, 16 experts top-4 of width 128 + 1 shared, vocab 2048
  (~15M): small enough that a fixed per-step cost shows beside the weight reads the 0.3B model hides it in;
- ``quick``: d 256, 8 layers, 2 heads of 128, 8 experts top-2, vocab 4096 (a smoke run).

The llama.cpp peer runs as its users run it (``LlamaPeer``): flash attention on (its CLI's default, ``-fa
auto``, is on for CPU) and an f16 KV cache (its default); other settings are named rows, never defaults.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUTTYPES = ("f32", "q8_0")
# size -> (d, layers, heads, head dim, vocab, dense width, expert width, kv rank, experts, top-k)
SIZES = {
    "0.3b": (1024, 16, 8, 128, 32768, 2816, 192, 256, 16, 2),
    "15m": (256, 8, 4, 64, 2048, 512, 128, 128, 16, 4),
    "quick": (256, 8, 2, 128, 4096, 512, 128, 128, 8, 2),
}
LABEL = {"0.3b": "~0.3B", "15m": "~15M", "quick": "--quick d 256"}  # model sizes as headlines name them


def kimi_shapes(size: str) -> dict:
    """transformers ``KimiLinearConfig`` arguments of ``size`` (a ``SIZES`` key)."""
    d, layers, heads, hd, vocab, dense, width, kv_rank, experts, top_k = SIZES[size]
    kinds = ["M" if (i + 1) % 4 == 0 else "L" for i in range(layers)]
    return {
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": dense,
        "moe_intermediate_size": width,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "kv_lora_rank": kv_rank,
        "q_lora_rank": None,  # llama.cpp's kimi-linear graph has one attn_q matrix
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": hd,
        "v_head_dim": hd,
        "num_experts_per_tok": top_k,
        "num_experts": experts,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "max_position_embeddings": 1 << 16,
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "L"],
            "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k == "M"],
            "head_dim": hd,
            "num_heads": heads,
            "short_conv_kernel_size": 4,
        },
    }


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "longmoe", *args], check=True, cwd=ROOT)


def build(workdir: Path, size: str) -> dict[str, Path]:
    """``{"hf", "longmoe", "f32", "q8_0"}`` paths under ``workdir``, each built only if missing."""
    workdir.mkdir(parents=True, exist_ok=True)
    hf, lm = workdir / "hf", workdir / "longmoe"
    if not (hf / "config.json").exists():
        from transformers import KimiLinearConfig, KimiLinearForCausalLM

        logging.getLogger("transformers").setLevel(logging.ERROR)
        torch.manual_seed(0)
        KimiLinearForCausalLM(KimiLinearConfig(**kimi_shapes(size))).save_pretrained(hf)
    if not (lm / "config.json").exists():
        _cli("convert", "--from-hf", str(hf), "--out", str(lm), "--dtype", "float32")
    if not (lm / "tokenizer.json").exists():
        from bench.common import bench_tokenizer

        bench_tokenizer(512).save(lm)  # GGUF needs a vocabulary; the ids are random anyway
    out = {"hf": hf, "longmoe": lm}
    for t in OUTTYPES:
        out[t] = workdir / f"model-{t}.gguf"
        if not out[t].exists():
            _cli("convert", "--to-gguf", str(lm), "--out", str(out[t]), "--outtype", t)
    return out


def hf_logits(hf: Path, ids: list[int]) -> torch.Tensor:
    """transformers' fp32 logits ``[T, V]`` of ``ids`` (the reference for a parity disagreement)."""
    from transformers import KimiLinearForCausalLM

    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = KimiLinearForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


KV_TYPES = {"f16": 1, "f32": 0}  # ggml type ids (llama_cpp.GGML_TYPE_F16 / _F32)


def setting(flash_attn: bool, kv: str) -> str:
    """How a llama.cpp row was configured, in its users' words (printed beside every peer row)."""
    fa = "flash attention on (CLI default)" if flash_attn else "flash attention off (previous setting)"
    return f"{fa}, KV cache {kv}" + (" (default)" if kv == "f16" else "")


def llama_build() -> dict:
    """llama-cpp-python's version and the vendored llama.cpp's build flags (``llama_print_system_info``);
    empty when it is not installed."""
    try:
        import importlib.metadata

        import llama_cpp
    except ImportError:
        return {}
    return {
        "llama-cpp-python": importlib.metadata.version("llama-cpp-python"),
        "llama.cpp": "the copy vendored in that llama-cpp-python release, built from source by pip",
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }


class LlamaPeer:
    """llama-cpp-python on one GGUF file: token ids in, prefill and single-token decode timed.

    ``flash_attn`` defaults on and ``kv`` to f16, llama.cpp's own CLI defaults: llama-cpp-python 0.3.36 turns
    flash attention *off* unless told, which materialises the score matrix at long context."""

    def __init__(
        self,
        path: Path,
        n_ctx: int,
        threads: int,
        n_batch: int = 2048,
        logits_all: bool = False,
        flash_attn: bool = True,
        kv: str = "f16",
    ):
        if kv not in KV_TYPES:
            raise ValueError(f"kv: one of {sorted(KV_TYPES)}, not {kv!r}")
        import llama_cpp

        self.lib = llama_cpp
        self.setting = setting(flash_attn, kv)
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            n_ubatch=n_batch,
            logits_all=logits_all,
            flash_attn=flash_attn,
            type_k=KV_TYPES[kv],
            type_v=KV_TYPES[kv],
            verbose=False,
        )

    def set_threads(self, threads: int) -> None:
        self.lib.llama_set_n_threads(self.llm._ctx.ctx, threads, threads)

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def step(self, token: int) -> None:
        self.llm.eval([token])

    def logits(self, ids: list[int]) -> torch.Tensor:
        """``[T, V]`` logits of every position (needs ``logits_all=True``)."""
        self.prefill(ids)
        return torch.from_numpy(self.llm.scores[: len(ids)].copy())

    def close(self) -> None:
        self.llm.close()
