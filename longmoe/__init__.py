"""longmoe: an ultra-long-context sparse Mixture-of-Experts language model you can read.

The package mirrors the architecture: ``ops`` (pure tensor functions and their references),
``layers`` (nn.Modules), ``model`` (the hybrid stack), ``data``/``train`` (pretraining),
``serve`` (inference engine and HTTP API) and ``eval`` (long-context evaluation).
"""

__version__ = "0.1.0"
