"""The long-horizon agent recipe (``longmoe recipe agent-long``): trajectory lengths of the long
suite, rollout throughput at horizon 32, and credit assignment (outcome-only vs GiGPO vs GiGPO
without KL, curriculum vs direct) by RL at horizons 8 and 16."""
