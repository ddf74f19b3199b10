"""Multi-turn reuse of replies that re-encode differently (``serve/reply_ids.py``): cached-token share
of a chat's later turns with the kept reply ids off (budget 0: re-encoding, the old behaviour) and on.

The model is the tiny preset rewired to answer every chat with one token (greedy), like the demo
model's 40 newlines; with the bench tokenizer newlines stay one token each, so the reply is spaces,
which merge (40 generated ``" "`` re-encode as 5 tokens, and with the ``\\n`` before them). Token
counts only, no timing: the result does not depend on the machine's load.

    python -m bench.reply_ids            # writes bench/results/reply_ids.json and docs/serve.md's block
"""

from __future__ import annotations

import argparse

import httpx
import torch

from bench.common import bench_tokenizer, markdown_table, write_results
from bench.tables import ROOT
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.reply_ids import ReplyIds

VOCAB = 512
START, END = "<!-- bench:reply_ids:start -->", "<!-- bench:reply_ids:end -->"


def answer_only(m: LongMoE, token: int) -> LongMoE:
    """``m`` rewired in place so greedy decoding always picks ``token`` (like a demo model that answers
    every chat with newlines): embedding dim 0 carries a large constant, the final norm keeps only that
    dim, the LM head reads it into ``token``'s logit alone."""
    with torch.no_grad():
        m.embed.weight[:, 0] += 50.0
        m.final_norm.weight.zero_()
        m.final_norm.weight[0] = 1.0
        m.lm_head.weight.zero_()
        m.lm_head.weight[token, 0] = 10.0
    return m


def constant_reply_model(vocab: int, token: int) -> LongMoE:
    """The tiny preset at ``vocab``, answering ``token`` only (``answer_only``)."""
    torch.manual_seed(0)
    return answer_only(LongMoE(preset("tiny").replace(vocab_size=vocab, tie_embeddings=False)), token).eval()


def conversation(url: str, turns: int, reply_tokens: int) -> list[dict]:
    """One chat of ``turns`` turns; each turn sends the whole history back. Per turn its usage."""
    msgs: list[dict] = [{"role": "system", "content": "Answer briefly."}]
    out = []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"question {t}: what comes after {t}?"})
        body = {"model": "tiny", "messages": msgs, "max_tokens": reply_tokens, "temperature": 0}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        j = r.json()
        msgs.append(j["choices"][0]["message"])
        out.append(j["usage"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--reply-tokens", type=int, nargs="+", default=[40, 200])
    args = ap.parse_args(argv)
    tok = bench_tokenizer(VOCAB)
    space = tok.encode(" ")[0]
    rows, res = [], []
    for n in args.reply_tokens:
        for label, budget in (("re-encoded (before)", 0), ("kept ids (after)", 16 << 20)):
            engine = Engine(constant_reply_model(VOCAB, space), tok, EngineConfig(prefill_chunk=64))
            app = create_app(engine, model_name="tiny")
            app.state.server.replies = ReplyIds(budget_bytes=budget)
            srv, th, port = serve_in_thread(app)
            try:
                usage = conversation(f"http://127.0.0.1:{port}", args.turns, n)
            finally:
                srv.should_exit = True
                th.join(timeout=30)
                engine.close()
            later = usage[1:]
            cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in later)
            prompt = sum(u["prompt_tokens"] for u in later)
            second = later[0]
            res.append({"reply_tokens": n, "mode": label, "turns": usage})
            first_hit = second["prompt_tokens_details"]["cached_tokens"]
            share = f"{100 * cached / prompt:.1f}%"
            rows.append([n, label, f"{first_hit} / {second['prompt_tokens']}", f"{cached} / {prompt}", share])
            print(rows[-1], flush=True)
    table = markdown_table(
        ["reply tokens", "next turn's reply", "turn 2: cached / prompt",
         f"turns 2-{args.turns}: cached / prompt", "cached share"], rows)  # fmt: skip
    write_results("reply_ids", {"results": res}, table, update_readme=False)
    doc = ROOT / "docs" / "serve.md"
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc}: no {START} ... {END} block")
    head, rest = text.split(START, 1)
    doc.write_text(head + START + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
