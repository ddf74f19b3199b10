"""Seeded tool-using environments for agentic SFT, RL and agent evaluation (see ``envs.base``)."""
