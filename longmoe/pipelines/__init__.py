"""Pipelines (recipes): end-to-end runs that chain the stages below (tokenizer, training, serving,
evaluation), each run as ``longmoe recipe <name> [--quick] [--out DIR] [options]`` (``longmoe recipe
--list``; ``python -m longmoe.pipelines.<name>`` is an alias).

A pipeline is a package with

- ``config.py``: a typed, validated config (a dataclass) — what to run;
- ``run.py``: the run itself, config in, a typed result (dataclasses, in ``result.py``) out;
  every pipeline resumes: finished steps leave files that a rerun reads instead of redoing the work;
- ``report.py``: renders a result to Markdown, JSON and plots (through ``longmoe.report.plotting.pyplot``),
  with no training or evaluation in it;
- a recipe module (``add_arguments`` / ``run``) registered in ``recipe.RECIPES``; ``recipe.py`` holds
  what every recipe shares (``--quick``, ``--out``, the one-line ``RecipeError``, provenance).

The recipes: ``demo`` (also ``longmoe demo``: tokenizer → curriculum pretraining → eval → MQAR recall
→ report), ``longctx_tiny`` (the layer-pattern ablation trained short and tested long),
``ablations`` (bounded vs unbounded decay, attention residuals, balancers), ``mqar`` (associative
recall vs state capacity per layer pattern, and length extrapolation; both docs/evidence.md),
``agent`` (pretrain → SFT → RL), ``agent-long`` (package ``agent_long``: long-horizon
trajectory lengths, rollouts at horizon 32, RL credit-assignment arms) and ``vision_extract``
(image → JSON extraction with a text-only control). Pipelines may import every other part of
longmoe; nothing else imports a pipeline except ``longmoe.cli`` (an import-linter contract).
"""
