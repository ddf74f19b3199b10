"""A request that fails inside the engine reaches the client as a failure it understands: an HTTP 500
in OpenAI's error shape (streamed: an error event before the stream closes), never a 200 whose
``finish_reason`` is ``"error"`` (no value OpenAI clients know), counted in ``/metrics`` by type; the
server then serves the next request as before."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from longmoe.serve.api import create_app
from tests.helpers.prom import scrape, value
from tests.helpers.server import serving


class _Boom(RuntimeError):
    pass


@pytest.fixture(scope="module")
def failing(make_engine):
    """A live server whose engine fails one step: with ``armed[0] = n``, the step after the next ``n``."""
    engine = make_engine(prefill_chunk=16)
    armed: list[int | None] = [None]
    step = engine.step

    def flaky_step():
        if armed[0] is not None:
            armed[0] -= 1
            if armed[0] < 0:
                armed[0] = None
                raise _Boom("injected step failure")
        return step()

    engine.step = flaky_step
    with serving(create_app(engine, model_name="tiny")) as url:
        yield url, armed
    engine.close()


BODY = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _errors(url: str) -> float:
    return value(scrape(url), "longmoe_request_errors_total", type="engine_error")


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)])
def test_failed_engine_step_is_a_500_in_openai_error_shape(failing, path, body):
    url, armed = failing
    before = _errors(url)
    armed[0] = 0
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "engine_error"
    assert "injected step failure" in err["message"]
    assert _errors(url) == before + 1
    # the server keeps serving
    assert httpx.post(url + path, json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)])
def test_failed_engine_step_mid_stream_sends_an_error_event(failing, path, body):
    url, armed = failing
    armed[0] = 3  # prefill and two decode steps go out first
    body = {**body, "stream": True, "max_tokens": 20, "ignore_eos": True}
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    assert not any(c.get("finish_reason") == "error" for p in payloads for c in p.get("choices", []))
    errs = [p["error"] for p in payloads if "error" in p]
    assert len(errs) == 1 and errs[0]["code"] == "engine_error", events
    assert events[-1] == "[DONE]" and "error" in payloads[-1]
    assert any(
        c.get("text") or c.get("delta", {}).get("content") for p in payloads for c in p.get("choices", [])
    )


def test_openai_client_raises_on_a_failed_step(failing):
    url, armed = failing
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    armed[0] = 0
    with pytest.raises(openai.InternalServerError, match="injected step failure"):
        client.completions.create(**BODY)
    armed[0] = 2
    with pytest.raises(openai.APIError, match="injected step failure"):
        for _ in client.chat.completions.create(**CHAT, stream=True):
            pass
