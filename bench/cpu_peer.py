"""The CPU side-by-side's model and its llama.cpp peer: a Kimi-Linear checkpoint built once in
transformers' format, imported with ``longmoe convert --from-hf``, exported with ``--to-gguf``.

Random weights (speed only). Full size: the ``small`` preset's shapes in Kimi-Linear's options (d 1024,
16 layers KDA:MLA 3:1, 8 heads of 128, NoPE MLA with kv rank 256 and no q rank, first layer dense 2816,
16 experts top-2 of width 192 + 1 shared, vocab 32768; ~0.3B total); ``--quick``: d 256, 8 layers.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUTTYPES = ("f32", "q8_0")


def kimi_shapes(quick: bool) -> dict:
    """transformers ``KimiLinearConfig`` arguments."""
    d, layers, heads, hd = (256, 8, 2, 128) if quick else (1024, 16, 8, 128)
    kinds = ["M" if (i + 1) % 4 == 0 else "L" for i in range(layers)]
    return {
        "vocab_size": 4096 if quick else 32768,
        "hidden_size": d,
        "intermediate_size": 512 if quick else 2816,
        "moe_intermediate_size": 128 if quick else 192,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "kv_lora_rank": 128 if quick else 256,
        "q_lora_rank": None,  # llama.cpp's kimi-linear graph has one attn_q matrix
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": hd,
        "v_head_dim": hd,
        "num_experts_per_tok": 2,
        "num_experts": 8 if quick else 16,
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


def build(workdir: Path, quick: bool) -> dict[str, Path]:
    """``{"hf", "longmoe", "f32", "q8_0"}`` paths under ``workdir``, each built only if missing."""
    workdir.mkdir(parents=True, exist_ok=True)
    hf, lm = workdir / "hf", workdir / "longmoe"
    if not (hf / "config.json").exists():
        from transformers import KimiLinearConfig, KimiLinearForCausalLM

        logging.getLogger("transformers").setLevel(logging.ERROR)
        torch.manual_seed(0)
        KimiLinearForCausalLM(KimiLinearConfig(**kimi_shapes(quick))).save_pretrained(hf)
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


class LlamaPeer:
    """llama-cpp-python on one GGUF file: token ids in, prefill and single-token decode timed."""

    def __init__(self, path: Path, n_ctx: int, threads: int, n_batch: int = 2048, logits_all: bool = False):
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            n_ubatch=n_batch,
            logits_all=logits_all,
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
