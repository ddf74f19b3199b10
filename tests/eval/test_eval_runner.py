"""Runner, endpoint client (against a fake OpenAI server on loopback), resuming, CLI, plots."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from longmoe.cli import main
from longmoe.eval.clients import ClientError, EndpointClient, Reply
from longmoe.eval.longctx import runner
from longmoe.eval.plots import plot_run
from longmoe.runlog import read_jsonl
from longmoe.tasks import TaskError


class FakeOpenAI:
    """A tiny OpenAI-compatible server: answers prompts it was told about, records every request."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.requests: list[dict] = []
        self.fail_next = 0  # answer HTTP 500 this many times
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if fake.fail_next > 0:
                    fake.fail_next -= 1
                    return self._send(500, {"error": "boom"})
                if self.path == "/v1/completions":
                    prompt = body["prompt"]
                    text = " " + fake.answers.get(prompt, "I do not know") + "\nQuestion: more"
                    return self._send(
                        200,
                        {"choices": [{"text": text}], "usage": {"prompt_tokens": 11, "completion_tokens": 3}},
                    )
                if self.path == "/v1/chat/completions":
                    prompt = body["messages"][-1]["content"]
                    msg = {"role": "assistant", "content": fake.answers.get(prompt, "no idea")}
                    return self._send(200, {"choices": [{"message": msg}]})
                if self.path == "/v1/broken":
                    return self._send(200, {"nothing": True})
                return self._send(404, {"error": "not found"})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeOpenAI()
    yield f
    f.close()


def test_parse_lengths_and_depths():
    assert runner.parse_lengths("512, 1k,4K") == [512, 1024, 4096]
    assert runner.parse_depths("5") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert runner.parse_depths("0.1,0.9") == [0.1, 0.9]
    assert runner.parse_depths(1) == [0.5]
    for bad in ("abc", "1k,x", "8"):
        with pytest.raises(TaskError, match="--lengths"):
            runner.parse_lengths(bad)
    with pytest.raises(TaskError, match="--depths"):
        runner.parse_depths("0.5,2")


def test_endpoint_client_completions_and_chat(fake):
    fake.answers["Q?"] = "42"
    c = EndpointClient(fake.url + "/v1/", "fake-model", api_key="sk-test")
    r = c.complete("Q?", 16)
    assert r.text.startswith(" 42") and r.prompt_tokens == 11
    req = fake.requests[-1]
    assert req["path"] == "/v1/completions" and req["model"] == "fake-model" and req["prompt"] == "Q?"
    assert req["temperature"] == 0.0 and req["stop"] == ["\n"] and req["max_tokens"] == 16
    assert req["auth"] == "Bearer sk-test"
    chat = EndpointClient(fake.url, "fake-model", mode="chat")
    assert chat.complete("Q?", 8).text == "42"
    assert fake.requests[-1]["messages"] == [{"role": "user", "content": "Q?"}]
    assert fake.requests[-1]["auth"] is None


def test_endpoint_client_retries_then_fails_clearly(fake):
    fake.answers["Q?"] = "7"
    c = EndpointClient(fake.url, "m", retries=2, backoff=0.01)
    fake.fail_next = 2
    assert c.complete("Q?", 4).text.strip().startswith("7"), "two 500s are retried"
    fake.fail_next = 10
    with pytest.raises(ClientError, match="HTTP 500"):
        c.complete("Q?", 4)
    fake.fail_next = 0
    bad = EndpointClient(fake.url, "m")
    bad.url = fake.url + "/v1/broken"
    with pytest.raises(ClientError, match="unexpected body"):
        bad.complete("Q?", 4)
    with pytest.raises(ClientError, match="--api-model"):
        EndpointClient(fake.url, "")
    with pytest.raises(ClientError, match="http"):
        EndpointClient("127.0.0.1:1", "m")
    dead = EndpointClient("http://127.0.0.1:9", "m", retries=0, timeout=2)
    with pytest.raises(ClientError, match="failed after 1 tries"):
        dead.complete("Q?", 4)


def test_runner_scores_resumes_and_limits(fake, tok, tmp_path):
    grid = runner.build_grid(["niah_single", "conflict"], [512], [0.0, 1.0], 2, seed=0, tokenizer=tok)
    assert len(grid) == 8 and len({g.id for g in grid}) == 8
    for g in grid:  # the fake knows the niah answers only
        if g.task == "niah_single":
            fake.answers[g.item.prompt()] = g.item.answer_text()
    client = EndpointClient(fake.url, "fake")
    rows = runner.run_grid(client, grid, tmp_path, tok, limit=3, progress=False)
    assert len(rows) == 3 and len(fake.requests) == 3
    rows2 = runner.run_grid(client, grid, tmp_path, tok, progress=False)
    assert len(rows2) == 5 and len(fake.requests) == 8, "resuming skips the 3 finished items"
    assert runner.run_grid(client, grid, tmp_path, tok, progress=False) == []
    assert len(fake.requests) == 8
    with (tmp_path / runner.RESULTS_FILE).open("a") as fh:
        fh.write('{"id": "torn')  # a run killed mid-write
    lines = read_jsonl(tmp_path / runner.RESULTS_FILE)
    assert sorted(r["id"] for r in lines) == sorted(g.id for g in grid)
    s = runner.write_summary(tmp_path)
    acc = {r["task"]: r["all"] for r in s["by_length"]}
    assert acc == {"niah_single": 1.0, "conflict": 0.0}
    assert {(c["task"], c["depth"]) for c in s["cells"]} == {
        (t, d) for t in ("niah_single", "conflict") for d in (0.0, 1.0)
    }
    md = (tmp_path / runner.SUMMARY_MD).read_text()
    assert "| niah_single | 1.00 (n=4) |" in md and "| conflict | 0.00 (n=4) |" in md
    written = plot_run(tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["accuracy_vs_length.png", "heatmap_conflict.png", "heatmap_niah_single.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


class _Echo:
    """A client that answers through complete_batch (as the local engine does)."""

    name = "echo"

    def __init__(self):
        self.batches = []

    def complete_batch(self, prompts, max_tokens):
        self.batches.append(len(prompts))
        return [Reply("nothing") for _ in prompts]


def test_runner_batches(tok, tmp_path):
    grid = runner.build_grid(["recall"], [512], [0.5], 5, seed=1, tokenizer=tok)
    c = _Echo()
    runner.run_grid(c, grid, tmp_path, tok, batch_size=2, progress=False)
    assert c.batches == [2, 2, 1]


def test_cli_against_endpoint(fake, tok, tmp_path, capsys):
    out = tmp_path / "ev"
    argv = ["eval", "--endpoint", fake.url, "--api-model", "fake", "--tasks", "niah,recall"]
    argv += ["--tokenizer", str(tok.save(tmp_path / "tok"))]
    argv += ["--lengths", "512", "--depths", "2", "--n", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert len(fake.requests) == 4
    assert (out / "summary.json").is_file() and (out / "plots" / "heatmap_recall.png").is_file()
    assert "| niah | 0.00 (n=2) |" in capsys.readouterr().out
    assert main(argv) == 0 and len(fake.requests) == 4, "rerun resumes: nothing left to ask"


def test_cli_errors(tmp_path, capsys):
    assert main(["eval", "--tasks", "niah"]) == 2
    assert "exactly one of --model" in capsys.readouterr().err
    assert main(["eval", "--endpoint", "http://127.0.0.1:9", "--ppl-by-position"]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["eval", "--endpoint", "http://127.0.0.1:9", "--api-model", "m", "--tasks", "bogus"]) == 2
    assert "unknown task 'bogus'" in capsys.readouterr().err
    assert main(["eval", "--endpoint", "http://127.0.0.1:9", "--api-model", "m", "--out", str(tmp_path)]) == 2
    assert "--endpoint needs --tokenizer" in capsys.readouterr().err
    assert main(["eval", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
