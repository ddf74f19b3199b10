"""lm-evaluation-harness against ``longmoe serve``: the repo's offline tasks (tests/interop/lmeval_task: one
log-likelihood, one generate_until) run through ``lm_eval`` with the ``local-completions`` backend (remote
tokenizer: ``/tokenize``; log-likelihoods: ``/v1/completions`` with ``echo`` + ``logprobs``) and the
``local-chat-completions`` backend; every log-likelihood lm-eval reports equals longmoe's own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from longmoe.data.tokenizer import Tokenizer
from longmoe.model import LongMoE
from longmoe.presets import preset
from tests.helpers.models import nudge_off_init
from tests.helpers.tokenizer import tokenizer_for_tests

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests/interop/lmeval_task"  # relative to ROOT, as the task YAMLs' data_files are
VOCAB = 512


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``longmoe serve`` on a tiny random model (weights off init so scores differ per choice)."""
    d = tmp_path_factory.mktemp("lmeval_model")
    torch.manual_seed(0)
    model = LongMoE(preset("tiny").replace(vocab_size=VOCAB, max_seq_len=1024, tie_embeddings=False))
    nudge_off_init(model)
    model.save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    port = _free_port()
    cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(d), "--port", str(port),
           "--model-name", "tiny", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:  # /health is 200 while loading
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"longmoe serve did not start: {proc.stdout.read().decode()[-2000:]}")
        time.sleep(0.5)
    yield d, url
    proc.terminate()
    proc.wait(timeout=30)


def _lm_eval(url: str, backend: str, route: str, tasks: str, out: Path, more: str, *extra: str) -> list[dict]:
    """Run ``lm_eval`` as a user would; returns every logged sample."""
    args = f"model=tiny,base_url={url}{route},num_concurrent=1,max_retries=1{more}"
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", backend, "--model_args", args, "--tasks", tasks,
           "--include_path", TASKS, "--output_path", str(out), "--log_samples", *extra]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [
        json.loads(line) for f in sorted(out.rglob("samples_*.jsonl")) for line in f.read_text().splitlines()
    ]


def _own_loglikelihood(model: LongMoE, tok: Tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) computed here, tokenised as lm-eval does (trailing context spaces move
    to the continuation; the continuation's tokens are those of ``context + continuation`` past the
    context's)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), dim=-1)
    return sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))


def test_lm_eval_completions_loglikelihoods_equal_longmoe(served, tmp_path):
    d, url = served
    tasks = "longmoe_loglik,longmoe_generate"
    samples = _lm_eval(
        url, "local-completions", "/v1/completions", tasks, tmp_path, ",tokenizer_backend=remote"
    )
    model, tok = LongMoE.from_pretrained(d).eval(), Tokenizer.from_file(d)
    ll = [s for s in samples if "question" in s["doc"]]
    gen = [s for s in samples if "prompt" in s["doc"]]
    assert len(ll) == 5 and len(gen) == 4
    n = 0
    for s in ll:
        for args, resp in zip(s["arguments"].values(), s["resps"], strict=True):
            got = float(resp[0][0])
            want = _own_loglikelihood(model, tok, args["arg_0"], args["arg_1"])
            assert abs(got - want) < 2e-4, (args, got, want)
            n += 1
    assert n == sum(len(s["doc"]["choices"]) for s in ll)
    assert all(isinstance(s["resps"][0][0], str) for s in gen)  # generate_until answered through completions


def test_lm_eval_generate_through_chat(served, tmp_path):
    _, url = served
    route = "/v1/chat/completions"
    samples = _lm_eval(
        url, "local-chat-completions", route, "longmoe_generate", tmp_path, "", "--apply_chat_template"
    )
    assert len(samples) == 4 and all(isinstance(s["resps"][0][0], str) for s in samples)
