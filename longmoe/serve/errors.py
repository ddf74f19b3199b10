"""``EngineError``: a request the engine cannot take (shared by the engine, requests and images).

Its own module so that ``request.py`` and ``prompt_images.py`` both raise it without importing each
other, and the HTTP layer maps it to a 4xx/5xx without importing the engine.
"""

from __future__ import annotations


class EngineError(ValueError):
    """A request the engine cannot take; ``param`` names the offending field."""

    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.status = param, status
