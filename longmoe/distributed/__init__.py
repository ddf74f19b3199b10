"""longmoe.distributed: scale-out on torch.distributed, as wrappers around the unchanged model.

- ``parallel_dims``: ``ParallelDims(dp_shard, ep, cp)``, the named 3-D device mesh, process helpers
  (``init_distributed`` / ``teardown``, ``rank`` / ``world_size`` that work without ``torchrun``).
- ``parallelize``: ``parallelize(model, dims, mesh)``: FSDP2 per sublayer + root, optional activation
  checkpointing (expert and context parallelism plug in there).
- ``reduce``: global gradient clipping over sharded gradients, summed metrics, balancer statistics.
- ``checkpoint``: sharded model + optimizer state through DCP, resharded on load at any world size.
"""
