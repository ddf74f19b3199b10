"""Documents: time to first token of the first and the second question about one uploaded file.

The ``tiny`` preset's shapes (random weights, fp32, CPU, ``max_seq_len`` 300K) behind the HTTP
server with the Files API on (a local directory store). Per document size (8K / 64K / 256K tokens of
Markdown text built from the benchmark tokenizer's words): upload it through the official ``openai``
client, ask a first question (its prefill computes the document and stores its prefix snapshot) and
then a second, different question about the same file (it restores the snapshot and prefills only its
own tokens). TTFT is the time from sending a streamed request to its first chunk holding generated
text (the opening chunk, role only, is sent before any token and is skipped), measured by the client:
it includes tokenizing the whole prompt (the document too) and restoring the snapshot. ``cached`` is
``usage.prompt_tokens_details.cached_tokens`` of the second question.
Each size is one sample (the 256K first question alone takes minutes): single samples, labelled so.

    python -m bench.documents                 # 8K, 64K, 256K
    python -m bench.documents --sizes 8192    # one size
"""

from __future__ import annotations

import argparse
import io
import random
import resource
import tempfile
import time

import openai

from bench.common import bench_tokenizer, markdown_table, write_results
from bench.tables import ROOT
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.files.documents import DocumentLimits
from longmoe.serve.files.service import FileQuota
from longmoe.serve.files.store import LocalStore

SIZES = (8192, 65536, 262144)
MAX_CTX = 300_000


def document(tok, n_tokens: int, seed: int = 0) -> str:
    """Markdown of about ``n_tokens`` tokens (paragraphs of words the tokenizer knows)."""
    rng = random.Random(seed)
    words = [w for w in (tok.decode([i]).strip() for i in range(256, 512)) if w.isalpha()] or ["word"]
    paras, n = [], 0
    while n < n_tokens:
        p = " ".join(rng.choice(words) for _ in range(60)) + "."
        paras.append(p)
        n += len(tok.encode(p + "\n\n"))
    return "# Report\n\n" + "\n\n".join(paras)


def ttft(c: openai.OpenAI, fid: str, question: str) -> tuple[float, int, int]:
    """(seconds to the first content chunk, prompt tokens, cached tokens) of one streamed question."""
    t0 = time.perf_counter()
    first, usage = None, None
    stream = c.chat.completions.create(
        model="tiny",
        messages=[
            {
                "role": "user",
                "content": [{"type": "file", "file": {"file_id": fid}}, {"type": "text", "text": question}],
            }
        ],  # fmt: skip
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for ch in stream:  # the opening chunk (role only) is sent before any token: skip it
        if first is None and ch.choices and (ch.choices[0].delta.content or ch.choices[0].finish_reason):
            first = time.perf_counter() - t0
        if ch.usage is not None:
            usage = ch.usage
    assert first is not None and usage is not None
    return first, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    args = ap.parse_args(argv)
    tok = bench_tokenizer(512)
    cfg = preset("tiny").replace(vocab_size=512, max_seq_len=MAX_CTX)
    engine = Engine(LongMoE(cfg).eval(), tok, EngineConfig(prefill_chunk=2048, cache_budget_bytes=8 << 30))
    limits = DocumentLimits(max_chars=8_000_000)
    app = create_app(engine, model_name="tiny", files=LocalStore(tempfile.mkdtemp(prefix="bench-docs-")),
                     file_quota=FileQuota(max_file_bytes=256 << 20), document_limits=limits)  # fmt: skip
    srv, th, port = serve_in_thread(app)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)
    rows, res = [], []
    try:
        for n in args.sizes:
            text = document(tok, n, seed=n)
            f = c.files.create(
                file=(f"doc{n}.md", io.BytesIO(text.encode()), "text/markdown"), purpose="user_data"
            )
            doc_tokens = (f.model_extra or {})["tokens"]
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            t1, p1, c1 = ttft(c, f.id, "What is the first word of the report?")
            t2, p2, c2 = ttft(c, f.id, "Which word appears most often in it?")
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            r = {"target_tokens": n, "document_tokens": doc_tokens, "ttft_first_s": t1,
                 "ttft_second_s": t2, "prompt_tokens_first": p1, "prompt_tokens_second": p2,
                 "cached_first": c1, "cached_second": c2, "speedup": t1 / t2, "cpu_s": cpu}  # fmt: skip
            res.append(r)
            rows.append([f"{n // 1024}K", doc_tokens, t1, t2, f"{c2} / {p2}", f"{t1 / t2:.0f}x", round(cpu)])
            print(r, flush=True)
            c.files.delete(f.id)
    finally:
        srv.should_exit = True
        th.join(timeout=30)
        engine.close()
    table = markdown_table(
        ["document", "tokens", "TTFT 1st question, s", "TTFT 2nd question, s", "2nd: cached / prompt",
         "speed-up (1 sample)", "CPU s (both)"], rows)  # fmt: skip
    write_results("documents", {"results": res, "samples_per_size": 1}, table, update_readme=False)
    write_docs_table(table)
    return 0


def write_docs_table(table: str) -> None:
    """The table into docs/serve.md, between ``<!-- bench:documents:start -->`` and ``:end -->``."""
    doc = ROOT / "docs" / "serve.md"
    text = doc.read_text()
    start, end = "<!-- bench:documents:start -->", "<!-- bench:documents:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{doc}: no {start} ... {end} block")
    head, rest = text.split(start, 1)
    doc.write_text(head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    raise SystemExit(main())
