"""Where uploaded files live: an object store with two backends that pass the same tests.

``LocalStore`` (the embedded default, ``--files-dir``) keeps each object as ``<key>.bin`` with its
metadata beside it as ``<key>.json``; both are written to a temporary name in the same directory and
renamed into place (atomic on POSIX), metadata last, so a reader sees a whole object or none.
``S3Store`` (``--files-s3 s3://bucket/prefix?endpoint_url=...``) keeps the bytes at ``<prefix><key>``
and the metadata as the JSON object ``<prefix><key>.json`` (written after the bytes, deleted first),
through ``boto3``. Every object's metadata carries the SHA-256 of its bytes, computed while the upload
streamed to disk, so a reader can check what it gets (``read`` does).

Keys are ``<owner>/<name>`` of ``[A-Za-z0-9_-]`` only: nothing a client sends is ever a path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlparse

KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}(/[A-Za-z0-9_.-]{1,128})?$")
CHUNK = 1 << 20


class StoreError(RuntimeError):
    """The store could not do what was asked (missing object, unreadable backend)."""


def check_key(key: str) -> str:
    if not KEY.match(key) or ".." in key:
        raise ValueError(f"bad object key {key[:80]!r}")
    return key


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(CHUNK):
            h.update(b)
    return h.hexdigest()


class ObjectStore(Protocol):
    """Bytes plus a JSON metadata dict per key (see the module docstring)."""

    def put(self, key: str, src: Path, meta: dict) -> None:
        """Store the file ``src`` (moved or copied) under ``key``, then ``meta`` beside it."""
        ...

    def put_bytes(self, key: str, data: bytes, meta: dict) -> None: ...

    def meta(self, key: str) -> dict | None:
        """The metadata of ``key``, or None when it does not exist (or is half-written)."""
        ...

    def read(self, key: str) -> bytes:
        """The bytes of ``key``, checked against the SHA-256 in its metadata (``StoreError`` if not)."""
        ...

    def list(self, owner: str) -> list[dict]:
        """The metadata of every object of ``owner`` (``<owner>/...``)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove the bytes and the metadata; False when there was nothing."""
        ...


def _json(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True).encode()


class LocalStore:
    """A directory (``--files-dir``); see the module docstring."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for tmp in self.root.rglob(".tmp-*"):  # a crash mid-write leaves only these: never an object
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _path(self, key: str, ext: str) -> Path:
        return self.root / f"{check_key(key)}.{ext}"

    def _write(self, dest: Path, data: bytes | None = None, src: Path | None = None) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                if src is not None:
                    with open(src, "rb") as s:
                        while b := s.read(CHUNK):
                            f.write(b)
                else:
                    f.write(data or b"")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put(self, key: str, src: Path, meta: dict) -> None:
        self._write(self._path(key, "bin"), src=src)
        self._write(self._path(key, "json"), _json(meta))

    def put_bytes(self, key: str, data: bytes, meta: dict) -> None:
        self._write(self._path(key, "bin"), data)
        self._write(self._path(key, "json"), _json(meta))

    def meta(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key, "json").read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as e:
            raise StoreError(f"metadata of {key} unreadable: {e}") from None

    def read(self, key: str) -> bytes:
        meta = self.meta(key)
        if meta is None:
            raise StoreError(f"no object {key}")
        data = self._path(key, "bin").read_bytes()
        return _checked(key, data, meta)

    def list(self, owner: str) -> list[dict]:
        d = self.root / check_key(owner)
        if not d.is_dir():
            return []
        out = []
        for p in sorted(d.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_bytes()))
        return out

    def delete(self, key: str) -> bool:
        found = False
        for ext in ("json", "bin"):  # metadata first: a half-deleted object is invisible
            with contextlib.suppress(FileNotFoundError):
                self._path(key, ext).unlink()
                found = True
        return found


def _checked(key: str, data: bytes, meta: dict) -> bytes:
    want = meta.get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise StoreError(f"object {key}: content hash mismatch (stored bytes damaged)")
    return data


class S3Store:
    """An S3-compatible bucket through ``boto3``; ``url`` is ``s3://bucket/prefix`` with optional
    ``?endpoint_url=http://host:port&region=...`` (credentials: boto3's usual environment/config)."""

    def __init__(self, url: str) -> None:
        import boto3  # optional: only this backend needs it

        u = urlparse(url)
        if u.scheme != "s3" or not u.netloc:
            raise ValueError(f"--files-s3: expected s3://bucket/prefix, got {url!r}")
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        self.bucket, self.prefix = u.netloc, u.path.lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        self.s3 = boto3.client(
            "s3", endpoint_url=q.get("endpoint_url"), region_name=q.get("region", "us-east-1")
        )
        self._errors = (self.s3.exceptions.ClientError,)

    def with_prefix(self, sub: str) -> S3Store:
        """This store under ``<prefix><sub>/`` (tests keep apart in one bucket)."""
        self.prefix = f"{self.prefix}{check_key(sub)}/"
        return self

    def _k(self, key: str, ext: str) -> str:
        return f"{self.prefix}{check_key(key)}.{ext}"

    def put(self, key: str, src: Path, meta: dict) -> None:
        self.s3.upload_file(str(src), self.bucket, self._k(key, "bin"))  # multipart, streamed from disk
        self.s3.put_object(Bucket=self.bucket, Key=self._k(key, "json"), Body=_json(meta))

    def put_bytes(self, key: str, data: bytes, meta: dict) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._k(key, "bin"), Body=data)
        self.s3.put_object(Bucket=self.bucket, Key=self._k(key, "json"), Body=_json(meta))

    def _get(self, k: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=k)["Body"].read()
        except self._errors as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise StoreError(f"s3 get {k}: {e}") from None

    def meta(self, key: str) -> dict | None:
        raw = self._get(self._k(key, "json"))
        return None if raw is None else json.loads(raw)

    def read(self, key: str) -> bytes:
        meta = self.meta(key)
        data = self._get(self._k(key, "bin")) if meta is not None else None
        if meta is None or data is None:
            raise StoreError(f"no object {key}")
        return _checked(key, data, meta)

    def list(self, owner: str) -> list[dict]:
        out = []
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}{check_key(owner)}/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                if obj["Key"].endswith(".json") and (raw := self._get(obj["Key"])) is not None:
                    out.append(json.loads(raw))
        return sorted(out, key=lambda m: m.get("id", ""))

    def delete(self, key: str) -> bool:
        found = self.meta(key) is not None
        for ext in ("json", "bin"):
            self.s3.delete_object(Bucket=self.bucket, Key=self._k(key, ext))
        return found


def open_store(files_dir: str | None, files_s3: str | None) -> ObjectStore:
    """The store the CLI flags name (``--files-s3`` wins; default: a local directory)."""
    if files_s3:
        return S3Store(files_s3)
    return LocalStore(files_dir or "files")
