"""``longmoe eval longctx --as-files text|pdf``: each item's context uploaded through the Files API of
a real longmoe server, the question asked about the file (a ``file`` content part), scored as the
inline run is; the files are deleted afterwards (the store ends empty)."""

from __future__ import annotations

import pytest

from longmoe.eval.clients import ClientError, FileEndpointClient
from longmoe.eval.longctx import runner
from longmoe.serve.api import create_app
from longmoe.serve.files.store import LocalStore
from tests.helpers.server import serving

pytest.importorskip("pypdf")


@pytest.fixture(scope="module")
def server(make_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    engine = make_engine()
    with serving(create_app(engine, model_name="tiny", files=LocalStore(root))) as url:
        yield url, root
    engine.close()


@pytest.mark.parametrize(
    "as_files", [pytest.param("text", marks=pytest.mark.slow(wall="not measured")), "pdf"]
)
def test_longctx_items_asked_about_uploaded_files(server, tok, tmp_path, as_files):
    url, root = server
    grid = runner.build_grid(["multihop", "conflict"], [512], [0.5], 1, seed=0, tokenizer=tok)
    client = FileEndpointClient(url, "tiny", as_files)
    rows = runner.run_grid(client, grid, tmp_path, tok, max_tokens=4, progress=False)
    assert len(rows) == len(grid) == 2
    for g, r in zip(grid, rows, strict=True):
        assert r["prompt_tokens"] > len(tok.encode(g.item.question))  # the document is in the prompt
        assert isinstance(r["prediction"], str) and "all" in r
    assert [p for p in root.rglob("*") if p.is_file()] == []
    assert "documents as" in client.name


def test_bad_mode_is_refused():
    with pytest.raises(ClientError, match="--as-files"):
        FileEndpointClient("http://127.0.0.1:9", "m", "docx")
