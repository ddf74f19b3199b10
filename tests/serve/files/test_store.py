"""The object store's two backends pass the same tests: the local directory, and S3 through boto3
against a real S3-compatible server process (moto's server mode, started here on 127.0.0.1 and
stopped by PID). Round trip with metadata and content hash, per-owner listing, delete, damaged
bytes detected, keys that are never paths, and no temporary file left by a failed write."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longmoe.serve.files.store import LocalStore, S3Store, StoreError, sha256_file

pytest.importorskip("moto", reason="moto[server] is not installed (pip install -e '.[dev]')")
boto3 = pytest.importorskip("boto3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_url():
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="docs")
        yield f"s3://docs/longmoe?endpoint_url={endpoint}"
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return S3Store(request.getfixturevalue("s3_url") + "&region=us-east-1").with_prefix(tmp_path.name)


def _src(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "upload.bin"
    p.write_bytes(data)
    return p


def test_round_trip_keeps_bytes_and_metadata_with_their_hash(store, tmp_path):
    data = os.urandom(3 << 20)  # several S3 multipart chunks' worth
    src = _src(tmp_path, data)
    meta = {"id": "file-a", "object": "file", "sha256": sha256_file(src)}
    store.put("alice/file-a", src, meta)
    assert store.meta("alice/file-a") == meta
    assert store.read("alice/file-a") == data
    store.put_bytes("alice/file-a.doc", b"{}", {"derived": "file-a"})
    assert store.read("alice/file-a.doc") == b"{}"


def test_listing_is_per_owner_and_delete_removes_everything(store, tmp_path):
    src = _src(tmp_path, b"hello")
    for owner, name in (("alice", "file-1"), ("alice", "file-2"), ("bob", "file-3")):
        store.put(f"{owner}/{name}", src, {"id": name})
    assert [m["id"] for m in store.list("alice")] == ["file-1", "file-2"]
    assert [m["id"] for m in store.list("bob")] == ["file-3"]
    assert store.list("carol") == []
    assert store.delete("alice/file-1") is True
    assert store.delete("alice/file-1") is False
    assert store.meta("alice/file-1") is None
    with pytest.raises(StoreError):
        store.read("alice/file-1")
    assert [m["id"] for m in store.list("alice")] == ["file-2"]


@pytest.mark.parametrize("key", ["../x", "a/../../b", "/etc/passwd", "a/b/c", "a\x00", "", "a b", "a/.."])
def test_keys_are_never_paths(store, tmp_path, key):
    with pytest.raises(ValueError, match="bad object key"):
        store.put(key, _src(tmp_path, b"x"), {})


def test_damaged_bytes_are_detected_by_their_hash(tmp_path):
    st = LocalStore(tmp_path / "s")
    src = _src(tmp_path, b"original")
    st.put("o/file-1", src, {"sha256": sha256_file(src)})
    (tmp_path / "s" / "o" / "file-1.bin").write_bytes(b"tampered")
    with pytest.raises(StoreError, match="hash mismatch"):
        st.read("o/file-1")


def test_a_failed_write_leaves_no_object_and_no_temporary_file(tmp_path):
    st = LocalStore(tmp_path / "s")
    with pytest.raises(FileNotFoundError):
        st.put("o/file-1", tmp_path / "missing", {})
    assert st.meta("o/file-1") is None
    assert [p.name for p in (tmp_path / "s").rglob("*") if p.is_file()] == []
