"""The serving commands, one module each (``longmoe generate``, ``chat``, ``serve``), and the options
they share (``options.py``: engine flags generated from ``EngineConfig``, sampling flags)."""
