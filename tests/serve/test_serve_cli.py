"""CLI: ``longmoe generate`` streams the engine's output (also with a draft model and the prefix-cache
flags), ``longmoe chat`` runs from stdin,
``longmoe serve`` honours ``LONGMOE_API_KEY``; every option has a help string."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys

import httpx
import pytest

from longmoe.cli import build_parser, main
from longmoe.serve.sampling import SamplingParams
from tests.helpers.serve_proc import serve_process


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


def test_generate_streams_greedy_output(model_dir, engine, capsys):
    args = ["--temperature", "0", "--max-tokens", "6"]
    rc = main(["generate", "--model", str(model_dir), "def foo(x):", *args])
    assert rc == 0
    ref = engine.generate("def foo(x):", SamplingParams(max_tokens=6, temperature=0.0))
    assert capsys.readouterr().out == ref.text + "\n"


def test_generate_with_speculation_and_prefix_flags(model_dir, engine, capsys):
    args = ["--temperature", "0", "--max-tokens", "6", "--no-prefix-cache", "--prefix-block-size", "8"]
    spec = ["--draft-model", str(model_dir), "--num-speculative-tokens", "2"]  # the model drafts for itself
    assert main(["generate", "--model", str(model_dir), "def foo(x):", *args, *spec]) == 0
    ref = engine.generate("def foo(x):", SamplingParams(max_tokens=6, temperature=0.0))
    assert capsys.readouterr().out == ref.text + "\n"
    ns = build_parser("generate").parse_args(["generate", "--model", "m", "x", "--no-prefix-cache"])
    assert ns.prefix_cache is False and ns.draft_model is None
    assert main(["generate", "--model", str(model_dir), "x", "--num-speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err


def test_generate_bad_input(model_dir, tmp_path, capsys):
    assert main(["generate", "--model", str(model_dir), "x", "--top-p", "2"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "missing"), "x"]) == 2
    assert "not found" in capsys.readouterr().err


def test_generate_json_schema(model_dir, tmp_path, capsys):
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}  # fmt: skip
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    for seed in ("0", "1"):
        args = [
            "--json-schema",
            str(f),
            "--seed",
            seed,
            "--temperature",
            "1",
            "--max-tokens",
            "64",
            "--stats",
        ]
        assert main(["generate", "--model", str(model_dir), "x", *args]) == 0
        out = capsys.readouterr()
        doc = json.loads(out.out)
        assert doc["n"] in (1, 2, 3) and isinstance(doc["ok"], bool) and set(doc) == {"n", "ok"}
        assert "finish_reason=stop" in out.err
    f.write_text('{"type": "frobnicate"}')
    assert main(["generate", "--model", str(model_dir), "x", "--json-schema", str(f)]) == 2
    assert "--json-schema: invalid JSON schema" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "x", "--json-schema", str(tmp_path / "nope")]) == 2
    assert "--json-schema: cannot read" in capsys.readouterr().err


def test_chat_repl_from_stdin(model_dir, engine, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n/reset\nhello\n/exit\nnever read\n"))
    rc = main(["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "8"])
    assert rc == 0
    out = capsys.readouterr().out
    ids = engine.encode_chat([{"role": "user", "content": "hello"}])
    reply = engine.generate(ids, SamplingParams(max_tokens=8, temperature=0.0)).text
    assert out.count("assistant> ") == 2
    assert "[history cleared]" in out
    assert out.count(f"assistant> {reply}\n") == 2  # after /reset the same first turn again


def test_every_option_has_help():
    for cmd in ("generate", "chat", "serve"):
        p = build_parser(cmd)
        sub = next(a for a in p._actions if a.dest == "command").choices[cmd]
        missing = [a.dest for a in sub._actions if not a.help]
        assert not missing, f"{cmd}: options without help: {missing}"


def test_serve_command_with_env_api_key(model_dir):
    with serve_process(model_dir, threads=2, env={"LONGMOE_API_KEY": "sekret"}) as sp:
        url = sp.url
        assert httpx.get(url + "/v1/models").status_code == 401
        r = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200
        assert r.json()["data"][0]["id"] == model_dir.name
        body = {"model": model_dir.name, "prompt": "def main", "max_tokens": 4, "ignore_eos": True}
        auth = {"Authorization": "Bearer sekret"}
        r = httpx.post(url + "/v1/completions", json=body, headers=auth, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert sp.stop() == 0  # SIGTERM: the server and the engine's loop on the main thread both stop


def test_serve_on_a_taken_port_exits_with_an_error(model_dir):
    """The HTTP thread cannot bind: the engine's loop on the main thread stops too, exit status 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(model_dir), "--port", str(port)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "address already in use" in p.stderr
