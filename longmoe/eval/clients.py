"""Backends the runner can ask: a local longmoe model, or any OpenAI-compatible HTTP endpoint.

Every client has ``complete(prompt, max_tokens) -> Reply`` with greedy decoding (temperature 0),
stopping at the first newline after the answer: the task prompts end in ``Answer:`` and the answer
is one line. ``Reply.prompt_tokens`` is the prompt length the backend itself counted (None when it
does not say), so lengths can be checked against a foreign tokenizer.

- ``LocalClient``: a model directory (or a training run: see ``longmoe.checkpoint``) served by
  ``longmoe.serve.engine.Engine`` with its context limit raised past ``max_seq_len`` (chunked
  prefill into the cache, so long prompts fit).
- ``EndpointClient``: ``POST {url}/v1/completions`` (``prompt``) or ``/v1/chat/completions``
  (``messages``) with ``model``, ``max_tokens``, ``temperature=0``, ``stop=["\\n"]``; optional bearer key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from longmoe.data.tokenizer import Tokenizer
from longmoe.errors import UserError
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

PREFILL_CHUNK = 2048  # tokens per prefill call: bounds activation memory for long prompts
LOCAL_MAX_CONTEXT = 1 << 20  # prompt + answer tokens a local model may be asked (no positional limit)
API_MODES = ("completions", "chat")


class ClientError(UserError, RuntimeError):
    """A backend that cannot be used or answered badly (the message says which and why)."""


@dataclass
class Reply:
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class LocalClient:
    """A local model directory (or training run), served by the engine with batched greedy decoding.

    The engine's context limit is raised to ``max_context`` (default ``LOCAL_MAX_CONTEXT``) instead of
    the config's ``max_seq_len``: evaluating past the trained window is the point of the extrapolation
    runs, and NoPE + KDA have no positional limit. Long prompts are prefilled in chunks into the cache.
    """

    def __init__(
        self,
        path: str | Path,
        device: str = "cpu",
        max_context: int = LOCAL_MAX_CONTEXT,
        quantize: str | None = None,
    ) -> None:
        self.name = str(path)
        self.engine = Engine.from_dir(
            path, device=device, max_context=max_context, prefill_chunk=PREFILL_CHUNK, quantize=quantize
        )
        self.tokenizer: Tokenizer = self.engine.tokenizer

    def complete(self, prompt: str, max_tokens: int) -> Reply:
        return self.complete_batch([prompt], [max_tokens])[0]

    def complete_batch(self, prompts: list[str], max_tokens: list[int]) -> list[Reply]:
        """All prompts share the engine's batched decode (greedy, ``stop=["\\n"]``)."""
        params = [SamplingParams(max_tokens=m, temperature=0.0, stop=["\n"]) for m in max_tokens]
        replies = []
        for c in self.engine.generate_batch(prompts, params):
            if c.finish_reason == "error":
                raise ClientError(f"engine failed on a prompt: {c.error}")
            replies.append(Reply(c.text, c.prompt_tokens, c.completion_tokens))
        return replies

    def close(self) -> None:
        self.engine.close()


class HTTPEndpoint:
    """One route of an OpenAI-compatible server, shared by every endpoint client (completions, agent
    turns, extraction): the URL and model checks, the bearer key, and ``post`` with retries of
    transport errors, 429 and 5xx (exponential backoff, at most 8 s); any other status is returned
    for the caller to judge. ``url`` may end in ``/v1`` or not."""

    def __init__(
        self,
        url: str,
        model: str,
        route: str,
        api_key: str | None = None,
        timeout: float = 600.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"endpoint {url!r} is invalid: expected an http:// or https:// URL")
        if not model:
            raise ClientError("an endpoint needs --api-model (the model name the server expects)")
        base = url.rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.url, self.model, self.name = f"{base}/v1/{route}", model, f"{model}@{base}"
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)

    def post(self, body: dict[str, Any]) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self.http.post(self.url, json=body)
            except httpx.TransportError as e:  # connection refused/reset, timeout
                last = e
            else:
                if r.status_code < 500 and r.status_code != 429:
                    return r
                last = ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:200]}")
            if attempt < self.retries:
                time.sleep(min(8.0, self.backoff * 2**attempt))
        raise ClientError(f"{self.url} failed after {self.retries + 1} tries: {last}")

    def check_ok(self, r: httpx.Response) -> None:
        if r.status_code != 200:
            raise ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:300]}")

    def first_choice(self, r: httpx.Response) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(body, body["choices"][0])`` of a 200 response, or a ClientError naming the body."""
        self.check_ok(r)
        try:
            body = r.json()
            return body, body["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ClientError(f"{self.url} returned an unexpected body: {r.text[:300]}") from e

    def close(self) -> None:
        self.http.close()


class FileEndpointClient(HTTPEndpoint):
    """An OpenAI-compatible server with the Files API: each item's context is uploaded as a file
    (``as_files``: ``text`` as Markdown, ``pdf`` as a PDF with a text layer, ``serve/files/make_pdf``),
    the question asked in a chat message holding a ``{"type": "file"}`` part, and the file deleted."""

    def __init__(self, url: str, model: str, as_files: str, api_key: str | None = None,
                 timeout: float = 600.0) -> None:  # fmt: skip
        if as_files not in ("text", "pdf"):
            raise ClientError(f"--as-files {as_files!r} is invalid: expected text or pdf")
        super().__init__(url, model, "chat/completions", api_key, timeout)
        self.files_url, self.as_files = self.url.replace("/chat/completions", "/files"), as_files
        self.name += f" (documents as {as_files} files)"

    def upload(self, context: str) -> str:
        if self.as_files == "pdf":
            from longmoe.serve.files.make_pdf import paginate, text_pdf

            data, name, ctype = text_pdf(paginate(context)), "context.pdf", "application/pdf"
        else:
            data, name, ctype = context.encode(), "context.md", "text/markdown"
        r = self.http.post(self.files_url, data={"purpose": "user_data"}, files={"file": (name, data, ctype)})
        self.check_ok(r)
        return r.json()["id"]

    def complete_item(self, context: str, question: str, max_tokens: int) -> Reply:
        fid = self.upload(context)
        try:
            content = [{"type": "file", "file": {"file_id": fid}}, {"type": "text", "text": question}]
            body = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, "stop": ["\n"],
                    "messages": [{"role": "user", "content": content}]}  # fmt: skip
            body, choice = self.first_choice(self.post(body))
        finally:
            self.http.delete(f"{self.files_url}/{fid}")
        try:
            text = choice["message"]["content"]
        except (KeyError, TypeError) as e:
            raise ClientError(f"{self.url} returned an unexpected body (no message content): {body}") from e
        usage = body.get("usage") or {}
        return Reply(text or "", usage.get("prompt_tokens"), usage.get("completion_tokens"))


class EndpointClient(HTTPEndpoint):
    """An OpenAI-compatible server (``/v1/completions`` or ``/v1/chat/completions``)."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        mode: str = "completions",
        timeout: float = 600.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if mode not in API_MODES:
            raise ClientError(f"api mode {mode!r} is invalid: expected one of {API_MODES}")
        route = "completions" if mode == "completions" else "chat/completions"
        super().__init__(url, model, route, api_key, timeout, retries, backoff)
        self.mode = mode

    def _payload(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        p: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stop": ["\n"],
        }
        if self.mode == "completions":
            p["prompt"] = prompt
        else:
            p["messages"] = [{"role": "user", "content": prompt}]
        return p

    def complete(self, prompt: str, max_tokens: int) -> Reply:
        body, choice = self.first_choice(self.post(self._payload(prompt, max_tokens)))
        return self._reply(body, choice)

    def _reply(self, body: dict[str, Any], choice: dict[str, Any]) -> Reply:
        try:
            text = choice["text"] if self.mode == "completions" else choice["message"]["content"]
        except (KeyError, TypeError) as e:
            raise ClientError(f"{self.url} returned an unexpected body (no choices[0] text): {body}") from e
        usage = body.get("usage") or {}
        return Reply(text or "", usage.get("prompt_tokens"), usage.get("completion_tokens"))
