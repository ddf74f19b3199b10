"""Shared test helpers, one concept per module (see tests/README.md): tiny models and configs
(``models``, ``train``, ``kimi``), a tokenizer (``tokenizer``), an app served in a thread (``server``),
a multi-process launcher (``launch``) and a fake agent environment (``agent``)."""
