"""Long-context ablation at tiny scale: layer pattern "L" vs "M" vs "LLLM", trained short, tested long.

``python -m longmoe.pipelines.longctx_tiny [--tokens N] [--out DIR]`` (settings: ``config.json`` in
this package, ``config.RecipeConfig``). For every pattern it:

1. builds the ``tiny`` preset with that ``layer_pattern`` and the same parameter count as the
   reference pattern (the first dense FFN's width absorbs the difference between a KDA and an MLA
   layer, so the ablation compares mixers, not sizes),
2. trains it with ``longmoe.train.pretrain.Trainer`` for the same token budget on one window of
   ``window`` tokens: standard-library files mixed with synthetic task documents
   (``synthetic_share``), same tokenizer, data order and seed for all patterns,
3. evaluates the task grid (``longmoe.eval``) at 1x, 2x, 4x and 8x the training window and the loss
   by position up to 8x,

then checks the expected outcomes (``checks``) and writes ``OUT/report.md``, ``OUT/results.json`` and
comparison plots in ``OUT/plots/`` (``report``). ``run.run_recipe`` takes a ``RecipeConfig`` and returns a
``result.RecipeResult``; every step resumes.

Synthetic documents are rendered at ``window x U[lo, hi]`` tokens (``synthetic_length``), not at
the full window: the packer lays documents back to back and a document of a full window (plus bos,
answer and eos) would always be cut, its question and answer landing in the next window without the
context they depend on. ``longmoe.train.mix.SyntheticSource`` does this; each curriculum stage carries
its own range (``CurriculumStage.synthetic_length``).

Training is a two-stage curriculum over document length, short before long as in the seeds: the
first ``short_docs_fraction`` of the tokens packs short task documents (``short_docs_length``, e.g.
0.1-0.5 x window, several per window: more questions and answer tokens per window while the model
has to learn to copy), and the rest uses the full range. The window itself never changes, so the
patterns see the same positions.
"""

from longmoe.pipelines.longctx_tiny.config import CONFIG_FILE, RecipeConfig
from longmoe.pipelines.longctx_tiny.result import Check, EvalResult, RecipeResult, TrainResult
from longmoe.pipelines.longctx_tiny.run import run_recipe

__all__ = ["CONFIG_FILE", "Check", "EvalResult", "RecipeConfig", "RecipeResult", "TrainResult", "run_recipe"]
