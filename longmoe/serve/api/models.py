"""``GET /v1/models`` and ``GET /v1/models/{id}``: the one model this server holds."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longmoe.serve.api.protocol import model_not_found
from longmoe.serve.api.security import check_key
from longmoe.serve.api.state import ServerState, server_state


def _card(st: ServerState) -> dict:
    return {
        "id": st.config.model_name,
        "object": "model",
        "created": st.created,
        "owned_by": "longmoe",
        "max_context": st.engine.max_context,
    }


async def list_models(request: Request) -> Response:
    st = server_state(request)
    check_key(request, st.config.api_key)
    return JSONResponse({"object": "list", "data": [_card(st)]})


async def retrieve_model(request: Request) -> Response:
    st = server_state(request)
    check_key(request, st.config.api_key)
    name = request.path_params["model_id"]
    if name != st.config.model_name:
        raise model_not_found(name, st.config.model_name)
    return JSONResponse(_card(st))
