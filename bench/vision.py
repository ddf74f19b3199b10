"""Vision input cost: image tokens per image and encode cost vs image size (linear patch projector vs
the small ViT encoder vs the conv encoder, in the same run), and training throughput of mixed
text+image batches vs text-only batches of the same token count (the same model, interleaved rounds).

``python -m bench.vision [--quick]`` writes ``bench/results/vision.json`` and ``vision.md``.

- Tokens: ``VisionConfig.image_tokens`` (patches + two markers) after the resize rule.
- Encode: ``VisionEncoder`` forward on a batch of same-size images; reported per image and as the
  ViT / linear and conv / linear ratios (conv: the vision_extract recipe's, 2 full-resolution 3x3
  layers of 16 channels, 16x16 stride-8 windows, width 64).
- Mixed batches: a ``tiny``-sized model with a vision encoder; the text-only batch is ``B x T`` random
  token ids, the mixed one the same shape with a ``form_easy``-sized image span in every row (patch
  positions filled by ``encode_images``, whose cost is included). Reported as tokens/s and the
  mixed / text ratio, forward+backward.

Every time is the fastest of its repeats (on a shared machine a slow sample is another process's load).
"""

from __future__ import annotations

import argparse

import torch

from bench.common import markdown_table, timeit, write_results
from longmoe.config import FFNConfig, ModelConfig, VisionConfig
from longmoe.data.images import image_span, patchify
from longmoe.data.tokenizer import MIN_VOCAB, SPECIAL_TOKENS, Tokenizer
from longmoe.layers.vision import Patches, VisionEncoder
from longmoe.model import LongMoE
from longmoe.tasks.documents import render

SIZES = [(32, 32), (64, 64), (32, 88), (128, 128), (256, 256), (512, 512)]
D_MODEL = 128


def encoders() -> dict[str, VisionEncoder]:
    lin = VisionConfig(patch_size=8, max_image_side=256, encoder="linear")
    vit = VisionConfig(patch_size=8, max_image_side=256, encoder="vit", width=128, depth=2, heads=4)
    conv = VisionConfig(patch_size=8, max_image_side=256, encoder="conv", width=64, depth=2, mlp_ratio=2)
    out = {"linear": VisionEncoder(lin, D_MODEL), "vit": VisionEncoder(vit, D_MODEL),
           "conv": VisionEncoder(conv, D_MODEL)}  # fmt: skip
    for e in out.values():
        e.init_weights(0.02)
        e.eval()
    return out


def encode_rows(n_images: int, iters: int) -> tuple[list[dict], list[list]]:
    encs = encoders()
    cfg = next(iter(encs.values())).cfg
    res, rows = [], []
    for h, w in SIZES:
        g = torch.Generator().manual_seed(h * 1000 + w)
        rh, rw = cfg.resized_size(h, w)
        p = cfg.patch_size
        imgs = [Patches(torch.rand((rh // p) * (rw // p), cfg.patch_dim, generator=g), rh // p, rw // p)
                for _ in range(n_images)]  # fmt: skip
        t = {}
        with torch.no_grad():
            for name, enc in encs.items():
                t[name] = (
                    timeit(lambda enc=enc, imgs=imgs: enc(imgs), warmup=2, iters=iters, stat=min) / n_images
                )
        tokens = cfg.image_tokens(h, w)
        res.append({"height": h, "width": w, "resized": [rh, rw], "tokens": tokens,
                    "linear_us_per_image": t["linear"] * 1e6, "vit_us_per_image": t["vit"] * 1e6,
                    "conv_us_per_image": t["conv"] * 1e6, "vit_over_linear": t["vit"] / t["linear"],
                    "conv_over_linear": t["conv"] / t["linear"]})  # fmt: skip
        rows.append([f"{h}x{w}", f"{rh}x{rw}", tokens, t["linear"] * 1e6, t["vit"] * 1e6, t["conv"] * 1e6,
                     t["vit"] / t["linear"], t["conv"] / t["linear"]])  # fmt: skip
    return res, rows


def tiny_model(encoder: str) -> LongMoE:
    torch.manual_seed(0)
    return LongMoE(
        ModelConfig(
            vocab_size=MIN_VOCAB, d_model=D_MODEL, n_layers=4, layer_pattern="LLLM", max_seq_len=4096,
            kda_heads=2, kda_head_dim=64, kda_gate_rank=16, mla_heads=2, mla_q_lora_rank=0,
            mla_kv_lora_rank=D_MODEL, mla_head_dim=64, mla_v_head_dim=64, attn_res_blocks=4,
            ffn=FFNConfig(kind="dense", dense_hidden=2 * D_MODEL),
            vision=VisionConfig(patch_size=8, max_image_side=256, encoder=encoder,
                                width=64 if encoder == "conv" else 128, depth=2, heads=4,
                                mlp_ratio=2 if encoder == "conv" else 4),
        )
    )  # fmt: skip


def _mixed_one(encoder: str, batch: int, seq: int, rounds: int, tok: Tokenizer) -> dict:
    """Median step seconds of a text-only batch and a mixed batch of the same shape, interleaved."""
    model = tiny_model(encoder)
    patches = [patchify(render("form_easy", 1_000_000_000 + i).image, model.cfg.vision) for i in range(batch)]
    g = torch.Generator().manual_seed(0)
    text = torch.randint(len(SPECIAL_TOKENS), MIN_VOCAB, (batch, seq), generator=g)  # no special tokens
    mixed = text.clone()
    for b, p in enumerate(patches):
        span = torch.tensor(image_span(p, tok))
        mixed[b, 4 : 4 + len(span)] = span
    labels_t, labels_m = text.roll(-1, 1), mixed.roll(-1, 1)

    def step_text() -> None:
        model.zero_grad(set_to_none=True)
        model(text, labels=labels_t).ce_loss.backward()

    def step_mixed() -> None:
        model.zero_grad(set_to_none=True)
        emb = model.encode_images(patches)  # [patches, d]
        model(mixed, labels=labels_m, image_embeds=emb).ce_loss.backward()

    tt, tm = [], []
    for _ in range(rounds):  # interleaved: drift on a shared machine hits both arms alike
        tt.append(timeit(step_text, warmup=2, iters=1))
        tm.append(timeit(step_mixed, warmup=2, iters=1))
    a, b, ntok = min(tt), min(tm), batch * seq  # the fastest round: a slow one is a neighbour's load
    return {"encoder": encoder, "batch": batch, "seq": seq,
            "image_tokens_per_row": sum(p.n for p in patches) // batch + 2,
            "text_tokens_per_s": ntok / a, "mixed_tokens_per_s": ntok / b,
            "mixed_over_text": a / b}  # fmt: skip


def mixed_rows(batch: int, seq: int, rounds: int) -> tuple[list[dict], list[list]]:
    tok = Tokenizer.train([], MIN_VOCAB)
    res = [_mixed_one(e, batch, seq, rounds, tok) for e in ("linear", "vit", "conv")]
    rows = [[r["encoder"], f"{batch}x{seq}", r["image_tokens_per_row"], r["text_tokens_per_s"],
             r["mixed_tokens_per_s"], r["mixed_over_text"]] for r in res]  # fmt: skip
    return res, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer images and rounds (seconds)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README benchmark table")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: stable on a shared machine)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    enc, enc_rows = encode_rows(n_images=4 if args.quick else 16, iters=2 if args.quick else 5)
    mix, mix_rows = mixed_rows(batch=4 if args.quick else 8, seq=128 if args.quick else 256,
                               rounds=1 if args.quick else 5)  # fmt: skip
    md = (
        "Image tokens and encode cost per image (8-px patches, images up to 256 px a side; a 2-layer ViT "
        "128 wide and the conv encoder (two full-resolution 3x3 layers of 16 channels, 16x16 stride-8 "
        "windows, width 64) vs the linear projector, d_model 128)\n\n"
        + markdown_table(
            ["image", "resized", "tokens", "linear µs", "ViT µs", "conv µs", "ViT / linear", "conv / linear"],
            enc_rows,
        )  # fmt: skip
        + "\n\nTraining step throughput, forward+backward, mixed text+image rows vs text-only rows of the "
        "same shape (4-layer LLLM, d_model 128; encode cost included)\n\n"
        + markdown_table(
            ["encoder", "batch", "image tokens/row", "text tok/s", "mixed tok/s", "mixed / text"], mix_rows
        )  # fmt: skip
    )
    write_results("vision_quick" if args.quick else "vision", {"encode": enc, "mixed": mix}, md,
                  update_readme=not (args.quick or args.no_readme))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
