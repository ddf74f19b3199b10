"""The Files API and file content parts through the official ``openai`` client: upload a PDF, ask two
questions about it (the second reuses the document's prefix snapshot: ``cached_tokens`` > 0),
inline ``file_data``, per-key ownership (another key: 404, listing only its own, quotas), the
cross-key probe of the salted prefix cache (0 cached tokens), delete (bytes, document and
snapshots gone), and the image-only PDF refused by a text model."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest

from longmoe.serve.api import create_app
from longmoe.serve.api.security import KeyRing
from longmoe.serve.files.service import FileQuota
from longmoe.serve.files.store import LocalStore
from tests.helpers.documents import image_pdf, text_pdf
from tests.helpers.server import serving, wait_idle

BS = 16
KEYS = {"alice-key-0001": "alice", "bob-key-00002": "bob"}
REPORT = ("The quarterly report of the river mill: output rose by nine percent, the new turbine "
          "was installed in March and the east gate was repaired.")  # fmt: skip


@pytest.fixture(scope="module")
def server(make_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    engine = make_engine(prefill_chunk=BS, prefix_block_size=BS)
    app = create_app(
        engine,
        model_name="tiny",
        api_key=KeyRing(KEYS),
        files=LocalStore(root),
        file_quota=FileQuota(max_files=3, max_bytes=1 << 20, max_file_bytes=256 << 10),
    )
    with serving(app) as url:
        yield engine, url, root
    engine.close()


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def ask(c: openai.OpenAI, file_part: dict, question: str):
    return c.chat.completions.create(
        model="tiny",
        messages=[
            {
                "role": "user",
                "content": [{"type": "file", "file": file_part}, {"type": "text", "text": question}],
            }
        ],
        max_tokens=2,
        temperature=0,
    )


def test_upload_pdf_then_second_question_reuses_the_document_snapshot(server):
    engine, url, _ = server
    alice = client(url, "alice-key-0001")
    pdf = text_pdf([REPORT, "Page two: the mill employs forty people."])
    f = alice.files.create(file=("report.pdf", io.BytesIO(pdf), "application/pdf"), purpose="user_data")
    assert f.id.startswith("file-") and f.bytes == len(pdf) and f.filename == "report.pdf"
    extra = f.model_extra or {}
    assert (
        extra["kind"] == "pdf" and extra["pages"] == 2 and extra["text_pages"] == 2 and extra["tokens"] > 40
    )
    assert alice.files.content(f.id).read() == pdf
    assert [x.id for x in alice.files.list().data] == [f.id]
    first = ask(alice, {"file_id": f.id}, "By how much did output rise?")
    wait_idle(engine)
    second = ask(alice, {"file_id": f.id}, "Who repaired the east gate?")
    assert first.usage.prompt_tokens > extra["tokens"]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= extra["tokens"] - BS  # the whole document block, up to the last block edge
    wait_idle(engine)
    # another key cannot see the file, and the same document text sent inline by it reuses nothing
    bob = client(url, "bob-key-00002")
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        ask(bob, {"file_id": f.id}, "By how much did output rise?")
    assert bob.files.list().data == []
    alice.files.delete(f.id)
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(f.id)
    assert alice.files.list().data == []


def test_cross_key_probe_sees_no_cached_tokens(server):
    engine, url, _ = server
    pdf = text_pdf([REPORT + " Probe edition."])
    part = {"file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode(), "filename": "p.pdf"}
    alice, bob = client(url, "alice-key-0001"), client(url, "bob-key-00002")
    ask(alice, part, "What rose?")
    wait_idle(engine)
    again = ask(alice, part, "What rose?")
    wait_idle(engine)
    probe = ask(bob, part, "What rose?")
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the same key reuses it
    assert probe.usage.prompt_tokens_details.cached_tokens == 0  # another key learns nothing


def test_delete_drops_the_files_prefix_snapshots(server):
    engine, url, root = server
    alice = client(url, "alice-key-0001")
    f = alice.files.create(file=("notes.md", io.BytesIO(("# Notes\n" + REPORT).encode()), "text/markdown"),
                           purpose="user_data")  # fmt: skip
    ask(alice, {"file_id": f.id}, "Summarise.")
    wait_idle(engine)
    before = engine.stats()["prefix_snapshots"]
    names = sorted(p.name for p in (root / "alice").iterdir())
    assert names == [f"{f.id}.bin", f"{f.id}.doc.bin", f"{f.id}.doc.json", f"{f.id}.json"]
    assert alice.files.delete(f.id).deleted
    assert engine.stats()["prefix_snapshots"] < before
    assert list((root / "alice").iterdir()) == []


def test_quota_and_limits_are_4xx(server):
    _, url, _ = server
    bob = client(url, "bob-key-00002")
    ids = [
        bob.files.create(file=(f"n{i}.txt", io.BytesIO(b"note %d" % i)), purpose="user_data").id
        for i in range(3)
    ]
    with pytest.raises(openai.PermissionDeniedError, match="quota"):
        bob.files.create(file=("n9.txt", io.BytesIO(b"one more")), purpose="user_data")
    for i in ids:
        bob.files.delete(i)
    with pytest.raises(openai.APIStatusError) as e:
        bob.files.create(file=("big.txt", io.BytesIO(b"x" * (300 << 10))), purpose="user_data")
    assert e.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose"):
        bob.files.create(file=("a.txt", io.BytesIO(b"text")), purpose="nonsense")  # type: ignore[arg-type]


def test_image_only_pdf_to_a_text_model_is_a_400_naming_the_reason(server):
    _, url, _ = server
    part = {
        "file_data": "data:application/pdf;base64," + base64.b64encode(image_pdf()).decode(),
        "filename": "scan.pdf",
    }
    with pytest.raises(openai.BadRequestError, match="no text layer.*reads text only"):
        ask(client(url, "alice-key-0001"), part, "What is on the page?")


def test_missing_key_is_401_and_files_off_is_404(make_engine):
    engine = make_engine()
    with serving(create_app(engine, model_name="tiny")) as url:
        r = httpx.get(url + "/v1/files")
        assert r.status_code == 404 and "--files-dir" in r.json()["error"]["message"]
    engine.close()
