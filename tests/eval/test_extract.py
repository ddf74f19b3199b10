"""Structured extraction (longmoe.eval.extract): the field metrics on hand cases, the summary's
standard errors, the vision endpoint client's request shape (a fake server on loopback), and the
``longmoe eval --tasks extract`` command end to end (resumable)."""

from __future__ import annotations

import base64
import io
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from longmoe.cli import main
from longmoe.eval.clients import ClientError
from longmoe.eval.extract.clients import EndpointExtractClient, chat_messages, png_data_uri
from longmoe.eval.extract.harness import flatten, micro_prf, parse_answer, score_answer, summarize
from longmoe.tasks.documents import held_out_seeds, render

GOLD = {"id": "A1B", "items": [{"name": "x", "price": "1.50"}], "total": "1.50"}


def test_flatten_paths_and_leaf_types():
    assert flatten(GOLD) == {
        "id": '"A1B"',
        "items.0.name": '"x"',
        "items.0.price": '"1.50"',
        "total": '"1.50"',
    }
    assert flatten({"n": 3, "s": "3", "e": [], "o": {}}) == {"n": "3", "s": '"3"', "e": "[]", "o": "{}"}


def test_perfect_answer():
    s = score_answer(json.dumps(GOLD, indent=2), GOLD)  # spacing and key order do not matter
    assert s["valid"] == s["exact"] == s["precision"] == s["recall"] == s["f1"] == 1.0


def test_missing_field():
    pred = {k: v for k, v in GOLD.items() if k != "total"}
    s = score_answer(json.dumps(pred), GOLD)
    assert s["valid"] == 1 and s["exact"] == 0
    assert s["precision"] == 1.0 and s["recall"] == 0.75 and s["f1"] == pytest.approx(2 * 0.75 / 1.75)


def test_extra_field_and_wrong_value():
    s = score_answer(json.dumps({**GOLD, "note": "hi"}), GOLD)
    assert s["precision"] == 0.8 and s["recall"] == 1.0 and s["exact"] == 0
    s = score_answer(json.dumps({**GOLD, "id": "A1C", "total": 1.5}), GOLD)  # 1.5 is not "1.50"
    assert s["tp"] == 2 and s["precision"] == s["recall"] == 0.5


def test_invalid_json_and_tolerated_wrappers():
    for bad in ("", "no json here", '{"id": "A1B",', "[1, 2]", '"just a string"'):
        s = score_answer(bad, GOLD)
        assert s["valid"] == 0 and s["f1"] == 0 and s["precision"] == 0 and s["recall"] == 0, bad
    fenced = "```json\n" + json.dumps(GOLD) + "\n```"
    assert parse_answer(fenced) == GOLD
    assert parse_answer("Here it is: " + json.dumps(GOLD) + " hope that helps") == GOLD


def test_summary_means_and_standard_errors():
    rows = [dict(family="a", **score_answer(t, GOLD)) for t in (json.dumps(GOLD), "oops")]
    rows.append(dict(family="b", **score_answer(json.dumps(GOLD), GOLD)))
    s = summarize(rows)["families"]
    assert s["a"]["n"] == 2 and s["a"]["f1"] == 0.5 and s["a"]["f1_se"] == pytest.approx(0.5)
    assert s["a"]["valid"] == 0.5 and s["b"]["micro_f1"] == 1.0 and math.isnan(s["b"]["micro_f1_se"])
    assert s["all"]["n"] == 3
    # pooled: 8 truth fields, 4 right, 4 predicted -> P 1, R 0.5
    assert s["a"]["micro_precision"] == 1.0 and s["a"]["micro_recall"] == 0.5
    same = micro_prf([rows[0], rows[0], rows[0]])
    assert same["micro_f1"] == 1.0 and same["micro_f1_se"] == 0.0


class FakeVision:
    """An OpenAI-style chat server that answers each image (by its data URI) or text it was told about."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                content = body["messages"][-1]["content"]
                if isinstance(content, list):
                    key = next(p["image_url"]["url"] for p in content if p["type"] == "image_url")
                else:
                    key = content
                msg = {"role": "assistant", "content": fake.answers.get(key, "I cannot read it")}
                data = json.dumps({"choices": [{"message": msg}], "usage": {"prompt_tokens": 9}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeVision()
    yield f
    f.close()


def test_messages_carry_the_exact_pixels_as_a_png_data_uri():
    d = render("form_easy", 5)
    (msg,) = chat_messages(d)
    part = next(p for p in msg["content"] if p["type"] == "image_url")
    head, b64 = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64"
    back = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert back.size == d.image.size and back.convert("RGB").tobytes() == d.image.tobytes()
    (txt,) = chat_messages(d, "text")
    assert d.text in txt["content"]
    with pytest.raises(ClientError, match="inputs="):
        chat_messages(d, "audio")


def test_endpoint_client_and_cli_resume(fake, tmp_path, capsys):
    seeds = held_out_seeds(3)
    for s in seeds[:2]:  # the fake knows two of three form_easy pages; receipts it answers wrongly
        d = render("form_easy", s)
        fake.answers[png_data_uri(d.image)] = d.target
    c = EndpointExtractClient(fake.url + "/v1", "m")
    (rep,) = c.extract([render("form_easy", seeds[0])], [64])
    assert json.loads(rep.text) == render("form_easy", seeds[0]).fields and rep.prompt_tokens == 9
    req = fake.requests[-1]
    assert req["temperature"] == 0.0 and req["max_tokens"] == 64 and req["model"] == "m"
    c.close()
    out = tmp_path / "ex"
    argv = ["eval", "--tasks", "extract", "--endpoint", fake.url, "--api-model", "m"]
    argv += ["--families", "form_easy,receipt", "--n", "3", "--out", str(out)]
    fake.requests.clear()
    assert main(argv) == 0
    assert len(fake.requests) == 6
    summary = json.loads((out / "extract_summary.json").read_text())["families"]
    assert summary["form_easy"]["exact"] == pytest.approx(2 / 3) and summary["receipt"]["valid"] == 0
    assert "| form_easy | 3 |" in capsys.readouterr().out
    assert main(argv) == 0 and len(fake.requests) == 6, "rerun resumes: nothing left to ask"


def test_cli_errors(capsys):
    assert main(["eval", "--tasks", "extract,niah", "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "runs alone" in capsys.readouterr().err
    assert main(["eval", "--tasks", "extract"]) == 2
    assert "exactly one of" in capsys.readouterr().err
    argv = ["eval", "--tasks", "extract", "--endpoint", "http://127.0.0.1:9", "--api-model", "m"]
    assert main([*argv, "--families", "poster"]) == 2
    assert "unknown document family 'poster'" in capsys.readouterr().err
