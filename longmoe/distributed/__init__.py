"""longmoe.distributed: not implemented yet.

Planned: FSDP2 (``fully_shard`` per block) and expert parallelism sharding the routed experts' dimension 0
(``w_in [E, ℓ, 2f]``, ``w_out [E, f, ℓ]``) with an all-to-all of the latent ``ℓ``-wide tokens. Nothing here is
used by training yet; training is single-process.
"""
