"""Backends the runner can ask: a local longmoe model, or any OpenAI-compatible HTTP endpoint.

Every client has ``complete(prompt, max_tokens) -> Reply`` with greedy decoding (temperature 0),
stopping at the first newline after the answer: the task prompts end in ``Answer:`` and the answer
is one line. ``Reply.prompt_tokens`` is the prompt length the backend itself counted (None when it
does not say), so lengths can be checked against a foreign tokenizer.

- ``LocalClient``: a model directory (or a training run: see ``resolve_model_dir``). It uses the
  serving engine (``longmoe.serve.engine.Engine``) when that is installed, else a small greedy loop
  over ``LongMoE`` with chunked prefill into the cache (``GreedyModel``), so long prompts fit.
- ``EndpointClient``: ``POST {url}/v1/completions`` (``prompt``) or ``/v1/chat/completions``
  (``messages``) with ``model``, ``max_tokens``, ``temperature=0``, ``stop=["\\n"]``; optional bearer key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PREFILL_CHUNK = 2048  # tokens per prefill call: bounds activation memory for long prompts
API_MODES = ("completions", "chat")


class ClientError(RuntimeError):
    """A backend that cannot be used or answered badly (the message says which and why)."""


@dataclass
class Reply:
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def load_model_dir(path: str | Path, device: str = "cpu") -> tuple[Any, Any, Path]:
    """``(LongMoE, Tokenizer, model_dir)`` from a model directory or a training run directory."""
    from longmoe.data.tokenizer import Tokenizer
    from longmoe.model import LongMoE
    from longmoe.train.checkpoint import resolve_model_dir

    d = resolve_model_dir(path)
    tok_file = d / "tokenizer.json"
    if not tok_file.is_file():
        raise FileNotFoundError(f"model directory {d} has no tokenizer.json")
    model = LongMoE.from_pretrained(d, device=device).eval()
    return model, Tokenizer.from_file(tok_file), d


class GreedyModel:
    """Greedy decoding straight on ``LongMoE``: chunked prefill into the cache, then one token per call."""

    def __init__(self, model: Any, tokenizer: Any, chunk: int = PREFILL_CHUNK) -> None:
        self.model, self.tokenizer, self.chunk = model, tokenizer, chunk
        self.stop_ids = {tokenizer.eos_id, tokenizer.end_id, tokenizer.pad_id}
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def complete_ids(self, ids: list[int], max_tokens: int) -> list[int]:
        if not ids:
            raise ClientError("empty prompt")
        cache = self.model.new_cache(1, self.device)
        logits = None
        for s in range(0, len(ids), self.chunk):
            x = torch.tensor([ids[s : s + self.chunk]], device=self.device)  # [1, t]
            logits = self.model(x, cache=cache).logits[0, -1]  # [V]
        out: list[int] = []
        for _ in range(max_tokens):
            t = int(torch.argmax(logits.float()))
            if t in self.stop_ids:
                break
            out.append(t)
            if "\n" in self.tokenizer.decode(out):  # stop=["\n"], as the engine and endpoints do
                break
            logits = self.model(torch.tensor([[t]], device=self.device), cache=cache).logits[0, -1]
        return out

    def complete(self, prompt: str, max_tokens: int) -> Reply:
        ids = self.tokenizer.encode(prompt, bos=True)
        out = self.complete_ids(ids, max_tokens)
        text = self.tokenizer.decode(out, skip_special_tokens=True).split("\n", 1)[0]
        return Reply(text, len(ids), len(out))


class LocalClient:
    """A local model directory, served by the engine (batched) when it is installed.

    Prompts longer than the engine's context window (``max_seq_len`` of the config, which the engine
    enforces) go through ``GreedyModel`` on the same weights: evaluating past the trained window is
    the point of the extrapolation runs, and NoPE + KDA have no positional limit.
    """

    def __init__(self, path: str | Path, device: str = "cpu", use_engine: bool | None = None) -> None:
        self.name = str(path)
        self.engine = None
        if use_engine is not False:
            try:
                from longmoe.serve.engine import Engine
                from longmoe.serve.sampling import SamplingParams
            except ImportError:
                if use_engine:
                    raise ClientError("use_engine=True but longmoe.serve.engine is not available") from None
            else:
                self.engine = Engine.from_dir(path, device=device)
                self._params = SamplingParams
                self.tokenizer = self.engine.tokenizer
                self.greedy = GreedyModel(self.engine.model.eval(), self.tokenizer)
        if self.engine is None:
            model, self.tokenizer, _ = load_model_dir(path, device)
            self.greedy = GreedyModel(model, self.tokenizer)

    @property
    def backend(self) -> str:
        return "engine" if self.engine is not None else "greedy"

    def _fits(self, prompt: str, max_tokens: int) -> bool:
        if self.engine is None:
            return False
        return len(self.tokenizer.encode(prompt, bos=True)) + max_tokens <= self.engine.max_context

    def complete(self, prompt: str, max_tokens: int) -> Reply:
        return self.complete_batch([prompt], [max_tokens])[0]

    def complete_batch(self, prompts: list[str], max_tokens: list[int]) -> list[Reply]:
        """Prompts that fit the engine's window share its batched decode; longer ones run one by one."""
        replies: list[Reply | None] = [None] * len(prompts)
        fit = [i for i, (p, m) in enumerate(zip(prompts, max_tokens)) if self._fits(p, m)]
        if fit:
            params = [self._params(max_tokens=max_tokens[i], temperature=0.0, stop=["\n"]) for i in fit]
            for i, c in zip(fit, self.engine.generate_batch([prompts[i] for i in fit], params)):
                if c.finish_reason == "error":
                    raise ClientError(f"engine failed on a prompt: {c.error}")
                replies[i] = Reply(c.text, c.prompt_tokens, c.completion_tokens)
        for i, r in enumerate(replies):
            if r is None:
                replies[i] = self.greedy.complete(prompts[i], max_tokens[i])
        return replies  # type: ignore[return-value]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class EndpointClient:
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
        import httpx

        if mode not in API_MODES:
            raise ClientError(f"api mode {mode!r} is invalid: expected one of {API_MODES}")
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"endpoint {url!r} is invalid: expected an http:// or https:// URL")
        if not model:
            raise ClientError("an endpoint needs --api-model (the model name the server expects)")
        base = url.rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.url = f"{base}/v1/{'completions' if mode == 'completions' else 'chat/completions'}"
        self.name, self.model, self.mode = f"{model}@{base}", model, mode
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)

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
        import httpx

        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self.http.post(self.url, json=self._payload(prompt, max_tokens))
            except httpx.TransportError as e:  # connection refused/reset, timeout
                last = e
            else:
                if r.status_code < 500 and r.status_code != 429:
                    return self._parse(r)
                last = ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:200]}")
            if attempt < self.retries:
                time.sleep(min(8.0, self.backoff * 2**attempt))
        raise ClientError(f"{self.url} failed after {self.retries + 1} tries: {last}")

    def _parse(self, r: Any) -> Reply:
        if r.status_code != 200:
            raise ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:300]}")
        try:
            body = r.json()
            choice = body["choices"][0]
            text = choice["text"] if self.mode == "completions" else choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ClientError(
                f"{self.url} returned an unexpected body (no choices[0] text): {r.text[:300]}"
            ) from e
        usage = body.get("usage") or {}
        return Reply(text or "", usage.get("prompt_tokens"), usage.get("completion_tokens"))

    def close(self) -> None:
        self.http.close()
