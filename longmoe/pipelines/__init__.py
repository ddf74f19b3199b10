"""Pipelines: end-to-end runs that chain the stages below (tokenizer, training, serving, evaluation).

A pipeline is a package with

- ``config.py``: a typed, validated config (a dataclass) — what to run;
- ``run.py``: the run itself, config in, a typed result (dataclasses, in ``result.py``) out;
  every pipeline resumes: finished steps leave files that a rerun reads instead of redoing the work;
- ``report.py``: renders a result to Markdown, JSON and plots, with no training or evaluation in it;
- a command line entry (a ``longmoe`` command or ``python -m longmoe.pipelines.<name>``).

Today: ``demo`` (``longmoe demo``: tokenizer → curriculum pretraining → eval → MQAR recall → report),
``longctx_tiny`` (``python -m longmoe.pipelines.longctx_tiny``: the layer-pattern ablation trained short
and tested long), ``ablations`` (``python -m longmoe.pipelines.ablations``: bounded vs unbounded decay,
attention residuals, balancers), ``mqar`` (``python -m longmoe.pipelines.mqar``: associative recall vs
state capacity per layer pattern, and length extrapolation; both docs/evidence.md) and ``agent``
(pretrain → SFT → RL). Pipelines may import every other part of longmoe; nothing outside this package
imports a pipeline.
"""
