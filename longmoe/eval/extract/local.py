"""Structured extraction with a local model: prompt layout and batched greedy decoding with images.

The prompt is the one the vision_extract recipe trains on: ``<|bos|>``, the page's image span
(``<|image|>`` + one ``<|image_patch|>`` per patch + ``<|/image|>``), the instruction and a newline;
the answer is the JSON followed by ``<|eos|>``. With ``inputs="text"`` the image span is replaced by
the page's content as text (the text-only control); with ``inputs="text_grid"`` the image span holds
the page's text as a character grid (``textgrid``: the text control with the image path's row/column
position signal). Decoding runs the model directly (not the
serving engine): prompts of equal length are prefilled together with their patch embeddings, then
decoded greedily through the cache; generation stops at ``<|eos|>`` or ``<|end|>``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch

from longmoe.checkpoint import load_model
from longmoe.data.images import image_span, patchify
from longmoe.data.tokenizer import Tokenizer
from longmoe.eval.clients import ClientError, Reply
from longmoe.eval.extract.clients import INPUTS, pdf_page_image
from longmoe.eval.extract.textgrid import text_grid
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.serve.prompt_images import image_token_ids
from longmoe.tasks.documents import INSTRUCTION, Document

LOCAL_INPUTS = (*INPUTS, "text_grid")  # a character grid needs the model's own encoder: local only


def prompt_ids(
    doc: Document, tok: Tokenizer, model: LongMoE, inputs: str = "image"
) -> tuple[list[int], Patches | None]:
    """The prompt's token ids and (for ``inputs="image"`` or ``"text_grid"``) the span's patches."""
    if inputs == "text":
        return [tok.bos_id, *tok.encode(f"{doc.text}\n{INSTRUCTION}\n")], None
    vis = model.cfg.vision
    if vis is None:
        raise ClientError("this model has no vision encoder (config field 'vision' is null): use text inputs")
    if inputs == "text_grid":
        patches = text_grid(doc.text, vis)
    else:  # "pdf": the page written as a PDF and rendered back as the server renders PDF pages
        patches = patchify(pdf_page_image(doc.image) if inputs == "pdf" else doc.image, vis)
    return [tok.bos_id, *image_span(patches, tok), *tok.encode(f"{INSTRUCTION}\n")], patches


@torch.no_grad()
def greedy_batch(
    model: LongMoE,
    prompts: list[list[int]],
    images: list[Patches | None],
    max_tokens: int,
    stop_ids: tuple[int, ...],
    banned_ids: Sequence[int] = (),
) -> list[list[int]]:
    """Greedy continuations of prompts that all have the same length (one cache row each), never
    choosing ``banned_ids`` (the image-span tokens: an image token without its patches is not text)."""
    dev = next(model.parameters()).device
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=dev)

    def pick(logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        if banned.numel():
            logits = logits.index_fill(-1, banned, float("-inf"))
        return logits.argmax(-1)

    x = torch.tensor(prompts, device=dev)  # [B, T]
    imgs = [p for p in images if p is not None]
    emb = model.encode_images(imgs) if imgs else None  # [sum patches, d]
    out = model(x, use_cache=True, image_embeds=emb, logits_to_keep=1)  # the head on the last position
    cache, nxt = out.cache, pick(out.logits[:, -1])  # [B]
    gen = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        for b, t in enumerate(nxt.tolist()):
            if not done[b]:
                if t in stop_ids:
                    done[b] = True
                else:
                    gen[b].append(t)
        if all(done):
            break
        out = model(nxt[:, None], cache=cache)
        nxt = pick(out.logits[:, -1])
    return gen


def decode_documents(
    model: LongMoE,
    tok: Tokenizer,
    docs: list[Document],
    max_tokens: list[int],
    inputs: str = "image",
    batch_size: int = 64,
) -> list[Reply]:
    """Greedy answers for ``docs`` (grouped by prompt length, ``batch_size`` rows at a time)."""
    if inputs not in LOCAL_INPUTS:
        raise ClientError(f"inputs={inputs!r} is invalid: expected one of {LOCAL_INPUTS}")
    was_training = model.training
    model.eval()
    built = [prompt_ids(d, tok, model, inputs) for d in docs]
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (ids, _) in enumerate(built):
        groups[len(ids)].append(i)
    stop = (tok.eos_id, tok.end_id)
    image_ids = image_token_ids(model, tok)  # what serving bans too: decode has no pixels
    replies: list[Reply | None] = [None] * len(docs)
    for length, idx in groups.items():
        for s in range(0, len(idx), batch_size):
            part = idx[s : s + batch_size]
            gen = greedy_batch(
                model, [built[i][0] for i in part], [built[i][1] for i in part],
                max(max_tokens[i] for i in part), stop, image_ids,
            )  # fmt: skip
            for i, g in zip(part, gen):
                g = g[: max_tokens[i]]
                replies[i] = Reply(tok.decode(g), length, len(g))
    model.train(was_training)
    return [r for r in replies if r is not None]


class ModelExtractClient:
    """A model in memory (a training run evaluating itself) answering with the recipe's prompt layout."""

    def __init__(
        self, model: LongMoE, tokenizer: Tokenizer, inputs: str = "image", name: str = "model"
    ) -> None:
        if inputs not in LOCAL_INPUTS:
            raise ClientError(f"inputs={inputs!r} is invalid: expected one of {LOCAL_INPUTS}")
        if inputs != "text" and model.cfg.vision is None:
            raise ClientError(f"{name}: the model has no vision encoder; use --extract-input text")
        self.model, self.tokenizer, self.inputs = model, tokenizer, inputs
        self.name = name + (f" ({inputs})" if inputs != "image" else "")

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def extract(self, docs: list[Document], max_tokens: list[int]) -> list[Reply]:
        return decode_documents(self.model, self.tokenizer, docs, max_tokens, self.inputs)

    def close(self) -> None:
        pass


class LocalExtractClient(ModelExtractClient):
    """A local model directory (or training run's final model)."""

    def __init__(self, path: str | Path, device: str = "cpu", inputs: str = "image") -> None:
        model, tok, meta = load_model(path, device)
        super().__init__(model, tok, inputs, str(meta.model_dir))
