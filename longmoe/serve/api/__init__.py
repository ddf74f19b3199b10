"""OpenAI-compatible HTTP server: a thin FastAPI shell around the ``Engine``, one module per API
surface (``completions``, ``chat``, ``models``, ``web``, ``metrics``) over shared plumbing
(``intake``: reading a body safely; ``generation``: submitting and responding; ``protocol``: the
request models; ``errors``; ``security``; ``middleware``; ``state``), assembled by ``app``.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/completions``, ``POST
/v1/chat/completions`` (streaming as server-sent events ending with ``data: [DONE]``), ``GET
/health``, Prometheus ``GET /metrics`` and a web chat page at ``GET /``. The engine runs on its own
thread; each HTTP request is a coroutine that submits to it and receives events through an
``asyncio.Queue`` fed thread-safely.
"""

from longmoe.serve.api.app import create_app, serve_in_thread, uvicorn_config
from longmoe.serve.api.state import ServerConfig

__all__ = ["ServerConfig", "create_app", "serve_in_thread", "uvicorn_config"]
