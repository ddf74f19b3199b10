"""Evaluation: three harnesses, one package each, run by ``longmoe eval longctx|agent|extract``.

- ``longctx/``: the long-context task grid (niah, multihop, conflict, recall) and loss by position;
- ``agent/``: tool-using episodes, success by horizon;
- ``extract/``: image -> JSON field extraction on rendered documents.

Shared at this level: the backends' common pieces (``clients``: errors, replies, the HTTP endpoint),
answer ``scoring``, loss by position (``ppl``), the options every harness takes (``args``) and the
``plots``. The harnesses never import each other (an import-linter contract).
"""
