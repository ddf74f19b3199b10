"""Interoperability with other model formats: transformers Kimi-Linear checkpoints (``longmoe convert``)."""
