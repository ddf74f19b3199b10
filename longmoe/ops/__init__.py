"""longmoe.ops: the model's numerical kernels as pure tensor functions (torch and the standard library only).

- ``kda``: the gated delta rule: ``chunk`` (training/prefill), ``step`` (decode), ``naive`` (reference);
- ``moe``: sparse MoE ``route``, dropless ``dispatch`` of the routed experts, ``naive`` dense reference;
- ``attention``: causal attention over packed documents (``packed``) and its masked reference (``naive``);
- ``glu``: the gated linear unit every feed-forward uses (dense MLP, shared and routed experts);
- ``gates``: the KDA decay gates.
"""
