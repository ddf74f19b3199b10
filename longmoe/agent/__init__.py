"""Agent rollouts: multi-turn tool-using episodes driven through the serving engine (see ``rollout``)."""
