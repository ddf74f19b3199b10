"""Agentic RL: group-relative and step-wise advantages, the clipped policy loss with KL, the trainer."""
