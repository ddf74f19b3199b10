"""An inductor graph pass for the compiled batch-1 decode step: one-row matmuls as fused reductions.

A batch-1 decode step's dense linears are matrix-vector products (``[1, d_in] @ W^T``): pure weight
reads, so their speed is memory bandwidth. Inductor hands ``mm``/``addmm`` to the BLAS library, whose
one-row fp32 kernel uses one thread: 12-15 GB/s here at 1 and 2 threads alike (60 cold 3072×1024
weights), while llama.cpp's f32 decode scales with the second thread. Written as
``(x[:, :, None] * W^T[None]).sum(1)`` the same product becomes an inductor C++ reduction that is
vectorized along the weight's contiguous input axis and split across threads: 14 GB/s at 1 thread,
31 GB/s at 2 on the same weights (docs/benchmarks.md, CPU serving).

The same holds for int8 weights (``--quantize int8``): PyTorch's ``_weight_int8pack_mm`` runs 8 GB/s of
int8 at 1 thread and 13.5 at 2 on the 0.3B model's shapes, while ``(x * q).sum(-1) * scale`` as an
inductor reduction (the int8 → fp32 conversion in registers) runs 15 and 26.

The pass rewrites only what it can prove: an ``mm``/``addmm`` (default scalars) whose left operand has a
static first dim of 1, fp32, on CPU; a ``_weight_int8pack_mm`` whose activation has a static first dim
of 1, on CPU. Batched graphs (symbolic ``B``), other dtypes and the int4 kernel are left to their
libraries. The sum reorders fp32 additions, so results match BLAS to rounding, not bit for bit (tested to
1e-5 relative); the int8 form accumulates in fp32 and rounds once to the kernel's output dtype.
(The routed experts are custom ops the pass cannot see into; ``ops/moe/reduce.py`` gives them the same
form while the step is traced.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten


def _val(a: object) -> torch.Tensor | None:
    """The fake value of a CPU tensor node, else None."""
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) and val.device.type == "cpu" else None


def _one_row(v: torch.Tensor) -> bool:
    """A matrix with a static first dim of 1 (a symbolic batch is not one row)."""
    return v.dim() == 2 and isinstance(v.shape[0], int) and v.shape[0] == 1


def _call(graph: torch.fx.Graph, op, args: tuple, mode) -> torch.fx.Node:
    """A new node with its fake ``meta["val"]`` (inductor's lowering reads it)."""
    node = graph.call_function(op, args)
    fake = tuple(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args)
    with mode:
        node.meta["val"] = op(*fake)
    return node


def _fp32_reduction(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """``mm(x [1, K], w [K, N])`` -> ``sum(x[:, :, None] * w[None], 1)`` ``[1, N]`` (``addmm`` adds its
    bias), or None when the node is not a one-row fp32 product on CPU."""
    bias, (x, w) = (None, node.args) if node.target is aten.mm.default else (node.args[0], node.args[1:])
    xv, wv = _val(x), _val(w)
    fp32 = xv is not None and wv is not None and xv.dtype == wv.dtype == torch.float32
    if not (fp32 and wv.dim() == 2 and _one_row(xv)):
        return None
    mode = xv.fake_mode
    with graph.inserting_before(node):
        xs = _call(graph, aten.unsqueeze.default, (x, 2), mode)  # [1, K, 1]
        ws = _call(graph, aten.unsqueeze.default, (w, 0), mode)  # [1, K, N]
        prod = _call(graph, aten.mul.Tensor, (xs, ws), mode)  # [1, K, N]
        out = _call(graph, aten.sum.dim_IntList, (prod, [1]), mode)  # [1, N]
        return out if bias is None else _call(graph, aten.add.Tensor, (out, bias), mode)


def _int8_reduction(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """``_weight_int8pack_mm(x [1, K], q [N, K], s [N])`` -> ``(x.float()[:, None] * q.float()[None])
    .sum(-1) * s.float()`` ``[1, N]`` in x's dtype, or None when the node is not one-row int8 on CPU."""
    x, q, s = node.args
    xv, qv, sv = _val(x), _val(q), _val(s)
    if xv is None or qv is None or sv is None:
        return None
    int8 = qv.dim() == 2 and qv.dtype == torch.int8 and sv.dim() == 1
    if not (int8 and xv.is_floating_point() and _one_row(xv)):
        return None
    mode, f32 = xv.fake_mode, torch.float32
    convert = torch.ops.prims.convert_element_type.default
    with graph.inserting_before(node):
        xf = _call(graph, convert, (x, f32), mode)  # [1, K]
        qf = _call(graph, convert, (q, f32), mode)  # [N, K]
        sf = _call(graph, convert, (s, f32), mode)  # [N]
        xs = _call(graph, aten.unsqueeze.default, (xf, 1), mode)  # [1, 1, K]
        qs = _call(graph, aten.unsqueeze.default, (qf, 0), mode)  # [1, N, K]
        dot = _call(graph, aten.sum.dim_IntList, (_call(graph, aten.mul.Tensor, (xs, qs), mode), [2]), mode)
        out = _call(graph, aten.mul.Tensor, (dot, sf), mode)  # [1, N]
        return _call(graph, convert, (out, xv.dtype), mode)


_REWRITES = {
    aten.mm.default: _fp32_reduction,
    aten.addmm.default: _fp32_reduction,
    aten._weight_int8pack_mm.default: _int8_reduction,
}


class OneRowGemv(CustomGraphPass):
    """One-row ``mm``/``addmm`` (fp32) and ``_weight_int8pack_mm`` nodes -> mul-sum reductions
    (``_fp32_reduction``, ``_int8_reduction``); every other node is left as it is."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            rewrite = _REWRITES.get(node.target) if node.op == "call_function" else None
            if rewrite is None or node.kwargs:  # addmm with beta/alpha: left alone
                continue
            out = rewrite(graph, node)
            if out is not None:
                node.replace_all_uses_with(out)
                graph.erase_node(node)
        graph.lint()

    def uuid(self) -> bytes:
        """Inductor's FX-graph cache key: this file's source, so an edit invalidates cached graphs."""
        return hashlib.sha256(Path(__file__).read_bytes()).digest()
