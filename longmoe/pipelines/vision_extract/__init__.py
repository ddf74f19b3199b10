"""``python -m longmoe.pipelines.vision_extract``: a tiny vision model trained from scratch on CPU reads
rendered forms into JSON (issue 23).

The main model sees each page as patches (``<|image|>`` + patch tokens + ``<|/image|>``) followed by
an instruction and learns to answer with the page's canonical JSON (loss on the JSON only). It is
scored on held-out renders of every family (``longmoe.eval.extract``), next to a text-only control
(the same content given as text, the same budget) and an interleaved-pretraining check (does mixing
image documents into an LM's batches hurt its text loss?). See docs/vision.md.
"""
