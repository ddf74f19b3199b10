"""Weight-only quantization: what int8 / int4 cost in validation loss and buy in bytes and decode speed.

A trained model (``--model DIR``, a model or training-run directory such as the demo's ``runs/demo``;
``--quick`` trains a small one here) served four ways in the same run: fp32 (as trained), bf16 (the
model cast), int8 and int4 (``longmoe.quantize``: linear and routed-expert weights packed, bf16
compute; embeddings, LM head, routers and MLA ``kv_up`` stay float). Measured per variant on held-out
documents (chunked prefill into one cache, as ``longmoe eval --ppl-by-position``): validation loss over
the first 1K and 4K tokens, the **KL divergence of its next-token distribution from fp32's**
(``KL(p_fp32 || p_variant)``, mean over positions) and how often its argmax equals fp32's; engine
decode ms/token at batch 1 (greedy, scheduler included) and weight bytes. A **unigram** row (token
frequencies of the training split, add-one smoothed) shows how far the model is from knowing nothing:
a loss difference means something only where the model is well below it.

    python -m bench.quant --model runs/demo
    python -m bench.quant --quick          # a ~1-minute training run, 1 document (smoke run)
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import markdown_table, write_results
from bench.serve_decode import WINDOWS, engine_decode
from longmoe.checkpoint import load_model
from longmoe.data.tokenizer import Tokenizer
from longmoe.eval.ppl import long_documents
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.quantize import quantize_model, weight_bytes
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.train.config import TrainConfig, tiny_curriculum
from longmoe.train.distill import corpus_tokens
from longmoe.train.pretrain import Trainer
from longmoe.train.run import train_tokenizer

VARIANTS = ("fp32", "bf16", "int8", "int4")
LENGTHS = (1024, 4096)


def train_quick(run_dir: Path, scale: float) -> Path:
    """A short run of the tiny preset's curriculum (``scale`` of its tokens); returns the run dir."""
    cfg = preset("tiny")
    tok = train_tokenizer(cfg.vocab_size, max_chars=2_000_000)
    tcfg = TrainConfig(stages=tiny_curriculum(scale, synthetic=False), eval_every=0, ckpt_every=0)
    t0 = time.perf_counter()
    Trainer(run_dir, cfg, tcfg, tok, progress=False).fit()
    print(f"trained in {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def doc_logprobs(model: LongMoE, ids: list[int], chunk: int = 1024) -> torch.Tensor:
    """``[len(ids) - 1, V]`` fp32 log-probabilities of the next token at every position (chunked prefill)."""
    x = torch.tensor(ids)[None]
    cache = model.new_cache(1)
    out = [
        F.log_softmax(model(x[:, s : min(s + chunk, len(ids) - 1)], cache=cache).logits[0].float(), -1)
        for s in range(0, len(ids) - 1, chunk)
    ]
    return torch.cat(out)


def unigram_logprobs(tok: Tokenizer, vocab: int, n_tokens: int = 2_000_000) -> torch.Tensor:
    """``[V]`` log-frequencies of the training split's tokens, add-one smoothed."""
    counts = torch.bincount(corpus_tokens(tok, n_tokens), minlength=vocab).double() + 1
    return (counts / counts.sum()).log().float()


def variant(model_dir: Path, name: str) -> tuple[LongMoE, Tokenizer]:
    model, tok, _ = load_model(model_dir)
    if name == "bf16":
        model = model.to(torch.bfloat16)
    elif name in ("int8", "int4"):
        quantize_model(model, name)
    return model.eval(), tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="model or training-run directory (default: train one)")
    ap.add_argument("--quick", action="store_true", help="tiny training run, 1 document, 8 decode tokens")
    ap.add_argument("--docs", type=int, default=None, help="validation documents (default 4; quick 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    n_docs = args.docs or (1 if args.quick else 4)
    n_dec = 8 if args.quick else 16
    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or train_quick(Path(tmp.name) / "run", 0.05 if args.quick else 0.25)

    results: dict = {"variants": {}}
    rows = []
    with torch.inference_mode():
        _, tok = variant(model_dir, "fp32")
        docs, concatenated = long_documents(tok, max(LENGTHS) + 1, n_docs)
        targets = [torch.tensor(d[1:]) for d in docs]
        uni = unigram_logprobs(tok, tok.vocab_size)
        uni_loss = torch.cat([-uni[t] for t in targets])  # [n_docs * L]
        results["unigram"] = {
            "val_loss": {n: float(uni_loss.view(len(docs), -1)[:, :n].mean()) for n in LENGTHS}
        }
        rows.append(["unigram (no model)", *results["unigram"]["val_loss"].values(), "", "", "", "", ""])
        ref: list[torch.Tensor] = []
        for name in VARIANTS:
            model, tok = variant(model_dir, name)
            kls, agree, losses = [], [], []
            for i, (d, t) in enumerate(zip(docs, targets, strict=True)):
                lp = doc_logprobs(model, d)  # [L, V]
                losses.append(-lp.gather(1, t[:, None])[:, 0])
                if name == "fp32":
                    ref.append(lp)
                kls.append((ref[i].exp() * (ref[i] - lp)).sum(-1))  # [L]
                agree.append(lp.argmax(-1) == ref[i].argmax(-1))
            loss = torch.stack(losses)  # [n_docs, L]
            val = {n: float(loss[:, :n].mean()) for n in LENGTHS}
            kl, top1 = float(torch.cat(kls).mean()), float(torch.cat(agree).float().mean())
            engine = Engine(model, tok, EngineConfig(max_context=1 << 14))
            with engine:
                engine_decode(engine, 32, n_dec)  # warm-up
                ms, _ = engine_decode(engine, 32, n_dec)
            wb = weight_bytes(model)
            results["variants"][name] = {
                "val_loss": val,
                "kl_from_fp32": kl,
                "top1_agreement_with_fp32": top1,
                "decode_ms": ms,
                "decode_tok_s": 1e3 / ms,
                "weight_bytes": wb,
            }
            rows.append([name, val[1024], val[4096], kl, top1, 1e3 / ms, wb["total"] / 2**20])
            print(rows[-1], flush=True)
    base = results["variants"]["fp32"]["weight_bytes"]["total"]
    for r in rows[1:]:
        r.append(r[6] * 2**20 / base)
    header = [
        "weights",
        "val loss @1K",
        "val loss @4K",
        "KL from fp32 (nats)",
        "top-1 = fp32's",
        "decode tok/s (batch 1)",
        "weight MiB",
        "vs fp32",
    ]
    table = markdown_table(header, rows)
    src = (
        f"--model {args.model}"
        if args.model
        else f"trained in this run, scale {0.05 if args.quick else 0.25}"
    )
    table += (
        f"\n\nCPU, {torch.get_num_threads()} thread(s), shared machine; tiny preset ({src}); "
        f"loss: mean next-token loss over the first 1K / 4K positions of {len(docs)} held-out document(s)"
        f"{' (short documents concatenated)' if concatenated else ''}; decode: engine, greedy, median gap "
        f"of {n_dec} tokens, best of {WINDOWS} windows, 32-token prompt. int8/int4: bf16 compute. KL and "
        "top-1: per position of the same documents against the fp32 model's next-token distribution."
    )
    write_results("quant_quick" if args.quick else "quant", results, table, update_readme=not args.quick)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
