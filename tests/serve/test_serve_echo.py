"""``/v1/completions`` with ``echo`` + ``logprobs`` (prompt scoring, what lm-evaluation-harness's
``local-completions`` sends for log-likelihood tasks) and the ``/tokenize``, ``/detokenize``,
``/tokenizer_info`` routes its remote tokenizer uses."""

from __future__ import annotations

import httpx
import pytest
import torch

from longmoe.serve.api import create_app
from longmoe.serve.engine import Engine
from tests.helpers.server import serving

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(make_engine):
    engine = make_engine(prefill_chunk=16)
    app = create_app(engine, model_name="tiny", api_key=KEY)
    with serving(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
        yield engine, c
    engine.close()


def _reference(engine: Engine, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(engine.model(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]


def _post(c: httpx.Client, body: dict) -> dict:
    r = c.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_scores_the_prompt_without_generating(server):
    engine, c = server
    ids = engine.tokenizer.encode("def scale(x, k):\n    return x * k\n")
    out = _post(c, {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 0})
    (ch,) = out["choices"]
    lp = ch["logprobs"]
    ref = _reference(engine, ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = [float(ref[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:], want, strict=True)) < 1e-4
    assert len(lp["tokens"]) == len(ids) and all(1 <= len(t) <= 2 for t in lp["top_logprobs"][1:])
    assert ch["text"] == engine.tokenizer.decode(ids)
    n = len(ids)
    details = {"cached_tokens": 0}  # scoring alone prefills nothing through the engine
    assert out["usage"] == {
        "prompt_tokens": n,
        "completion_tokens": 0,
        "total_tokens": n,
        "prompt_tokens_details": details,
    }


def test_lm_eval_payload_echo_plus_one_token(server):
    """lm-eval's log-likelihood request: a batch of one token-id prompt, ``max_tokens: 1``, ``logprobs: 1``,
    ``echo``; it reads ``token_logprobs[ctxlen:-1]`` and compares each with its ``top_logprobs`` entry."""
    engine, c = server
    ids = engine.tokenizer.encode("import os\nimport sys\n")
    out = _post(
        c, {"prompt": [ids], "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1}
    )
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the one generated token
    ref = _reference(engine, ids)
    assert abs(lp["token_logprobs"][-1] - float(ref[-1].max())) < 1e-4  # greedy: the argmax's log-prob
    for t in range(1, len(ids)):
        (best,) = lp["top_logprobs"][t].values()
        assert abs(best - float(ref[t - 1].max())) < 1e-4
    assert out["usage"]["completion_tokens"] == 1


def test_echo_of_a_text_prompt_and_a_batch(server):
    engine, c = server
    out = _post(c, {"prompt": ["x = 1", "y = 2\n"], "echo": True, "logprobs": 0, "max_tokens": 0})
    assert [ch["index"] for ch in out["choices"]] == [0, 1]
    assert [ch["text"] for ch in out["choices"]] == ["x = 1", "y = 2\n"]
    ids = engine.encode_prompt("x = 1")  # text prompts start with <|bos|>, as in generation
    assert out["choices"][0]["logprobs"]["tokens"][0] == "<|bos|>"
    assert len(out["choices"][0]["logprobs"]["token_logprobs"]) == len(ids)
    assert out["choices"][0]["logprobs"]["top_logprobs"] is None  # logprobs: 0 asks for no alternatives
    plain = _post(c, {"prompt": "x = 1", "echo": True, "max_tokens": 0})  # no logprobs: the text only
    assert plain["choices"][0]["text"] == "x = 1" and plain["choices"][0]["logprobs"] is None


def test_scoring_runs_in_the_engine_steps(server):
    """The echo path submits one engine request (no model call beside the engine's steps)."""
    engine, c = server
    before = engine.stats()["requests"]
    _post(c, {"prompt": "x = 1", "echo": True, "logprobs": 1, "max_tokens": 2})
    assert engine.stats()["requests"] == before + 1  # scored and generated as one request


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt": "a", "echo": True, "stream": True, "logprobs": 1}, "echo", "stream"),
        ({"prompt": ["a", "b"], "max_tokens": 2}, "prompt", "echo only"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", ">= 1"),
        ({"prompt": "a", "echo": True, "max_tokens": -1}, "max_tokens", ">= 0"),
        ({"prompt": [[1, 2], []], "echo": True, "max_tokens": 0}, "prompt", "empty"),
        ({"prompt": [10**9], "echo": True, "max_tokens": 0}, "prompt", "token ids"),
        ({"prompt": "a", "echo": True, "max_tokens": 0, "logprobs": -1}, "logprobs", "[0, 20]"),
        ({"prompt": "a", "echo": True, "max_tokens": 0, "logprobs": 10**6}, "logprobs", "[0, 20]"),
    ],
)
def test_echo_errors_name_the_field(server, body, param, message):
    _, c = server
    r = c.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"]


def test_tokenizer_routes_round_trip(server):
    engine, c = server
    info = c.get("/tokenizer_info").json()
    assert (info["bos_token"], info["eos_token"]) == ("<|bos|>", "<|eos|>")
    text = "for i in range(3):\n    print(i)"
    toks = c.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert toks == engine.tokenizer.encode(text)
    assert c.post("/tokenize", json={"prompt": text, "add_special_tokens": True}).json()["tokens"][0] == 1
    assert c.post("/detokenize", json={"tokens": toks}).json()["prompt"] == text
    assert c.post("/detokenize", json={"tokens": [-1]}).status_code == 400
    assert httpx.get(str(c.base_url) + "/tokenizer_info").status_code == 401  # the key guards them
