"""Serving-test helpers (a unique module name: ``from conftest import`` collides across test folders)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from fastapi import FastAPI

from longmoe.config import VisionConfig
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.engine import Engine

VOCAB = 512
MAX_CONTEXT = 1024


def tiny_model(seed: int = 0, **kw) -> LongMoE:
    """The ``tiny`` preset (vocab 512) with weights moved off init, and untied
    embeddings (tied random ones make a model that repeats its input), so greedy outputs vary."""
    torch.manual_seed(seed)
    kw = {"vocab_size": VOCAB, "max_seq_len": MAX_CONTEXT, "tie_embeddings": False, **kw}
    cfg = preset("tiny").replace(**kw)
    m = LongMoE(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


VISION = VisionConfig(patch_size=4, max_image_side=32, encoder="vit", width=32, depth=1, heads=2)


def tiny_vision_model(seed: int = 0, **kw) -> LongMoE:
    """``tiny_model`` with a small ViT image encoder (4-pixel patches, images scaled to <= 32 px)."""
    return tiny_model(seed, vision=VISION, **kw)


@contextlib.contextmanager
def served(model_dir: Path, **engine_opts) -> Iterator[tuple[Engine, FastAPI, str]]:
    """The model in ``model_dir`` behind a real HTTP server on a free port: ``(engine, app, base_url)``."""
    engine = Engine.from_dir(model_dir, **engine_opts)
    app = create_app(engine, model_name="tiny")
    srv, th, port = serve_in_thread(app)
    try:
        yield engine, app, f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        th.join(timeout=10)
        engine.close()


def wait_idle(engine: Engine, timeout: float = 10.0) -> dict:
    """The engine's stats once no request is running or waiting (a response can reach the client a
    moment before the engine loop retires its request), or as they stand at ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return s
        time.sleep(0.01)
    return engine.stats()
