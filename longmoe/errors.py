"""The one base class for errors a user can fix (a bad flag, file or config), not bugs in longmoe.

``longmoe <command>`` prints such an error as one line, ``longmoe <command>: error: <message>``, and
exits with status 2; any other exception is a bug and keeps its traceback. Each package keeps its own
error type (``ConfigError``, ``DataError``, ``CheckpointError``, ...) as a subclass of ``UserError``,
so library callers can still catch the specific one.
"""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input; its message names the flag, file or field to fix."""
