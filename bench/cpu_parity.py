"""Why llama.cpp's logits drift from transformers' on the CPU side-by-side's Kimi-Linear model.

Small variants of ``cpu_peer``'s ``--quick`` model (d 256, 8 layers KDA:MLA 3:1, 8 experts top-2), each
built the same way (transformers ``KimiLinearForCausalLM`` -> ``longmoe convert --from-hf`` ->
``--to-gguf`` f32) and scored on the same token ids by transformers fp32 (the reference), longmoe fp32
and llama.cpp f32 (one thread, one ubatch). Each variant changes one thing:

- ``base``: the quick model as ``bench.cpu_serve`` builds it;
- ``router_bias``: a distinct ``e_score_correction_bias`` per expert, spaced 1.0 (more than the sigmoid's
  range), so every token picks the same two experts: no top-k choice can flip;
- ``dense``: a dense MLP in every layer (``first_k_dense_replace`` = layers): no router at all;
- ``base_eps``: ``rms_norm_eps`` = 1e-6, the epsilon transformers hard-codes in the KDA q/k l2-norm and
  the MLA ``kv_a_layernorm``, where llama.cpp uses ``rms_norm_eps`` (1e-5 here) for both.

Each variant has four llama.cpp rows: its default f16 KV cache (as ``bench.cpu_serve`` runs it) and an f32
one, each against transformers as released and against transformers run with llama.cpp's two epsilons
(``x / sqrt(sum x² + rms_norm_eps)`` in the q/k l2-norm, ``rms_norm_eps`` in ``kv_a_layernorm``).
For ``base`` it also reads llama.cpp's own top-k expert choice and per-layer mixer outputs (a ggml eval
callback) and lists every (layer, token) whose experts differ from transformers', with transformers'
top-k margin there, and how many decisions have a margin under ``--margin``.
(All-KDA or all-MLA layouts abort llama.cpp 0.3.36, ``GGML_ASSERT(buffer)``: its hybrid memory needs
both kinds, so the mixers are told apart per layer instead.)

    python -m bench.cpu_parity [--tokens 512] [--variants base,dense] [--workdir DIR] [--no-write]

Results: bench/results/cpu_parity.{json,md}; the README is not touched. About a minute on one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from bench import cpu_peer
from bench.common import bench_tokenizer, markdown_table, write_results

GGML_F32, GGML_F16, GGML_I32 = 0, 1, 26


def _dense(cfg: dict) -> None:
    cfg["first_k_dense_replace"] = cfg["num_hidden_layers"]


def _eps(cfg: dict) -> None:
    cfg["rms_norm_eps"] = 1e-6


def _router_bias(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.arange(buf.numel(), dtype=buf.dtype))


# name -> (what it changes, config edit, weight edit)
VARIANTS: dict[str, tuple[str, Callable[[dict], None] | None, Callable[[torch.nn.Module], None] | None]] = {
    "base": ("the --quick model", None, None),
    "router_bias": ("fixed top-k (distinct large correction bias)", None, _router_bias),
    "dense": ("dense MLP everywhere: no router", _dense, None),
    "base_eps": ("rms_norm_eps 1e-6 (= transformers' fixed eps)", _eps, None),
}


def build(workdir: Path, name: str) -> dict[str, Path]:
    """``{"hf", "longmoe", "f32"}`` of variant ``name`` under ``workdir/name`` (built once)."""
    _, cfg_edit, weight_edit = VARIANTS[name]
    d = workdir / name
    hf, lm, f32 = d / "hf", d / "longmoe", d / "model-f32.gguf"
    if not f32.exists():
        from transformers import KimiLinearConfig, KimiLinearForCausalLM

        logging.getLogger("transformers").setLevel(logging.ERROR)
        shutil.rmtree(d, ignore_errors=True)
        cfg = cpu_peer.kimi_shapes("quick")
        if cfg_edit is not None:
            cfg_edit(cfg)
        torch.manual_seed(0)
        model = KimiLinearForCausalLM(KimiLinearConfig(**cfg))
        if weight_edit is not None:
            weight_edit(model)
        model.save_pretrained(hf)
        cpu_peer._cli("convert", "--from-hf", str(hf), "--out", str(lm), "--dtype", "float32")
        bench_tokenizer(512).save(lm)  # GGUF needs a vocabulary; the ids are random anyway
        cpu_peer._cli("convert", "--to-gguf", str(lm), "--out", str(f32), "--outtype", "f32")
    return {"hf": hf, "longmoe": lm, "f32": f32}


@contextlib.contextmanager
def llama_cpp_eps(model: torch.nn.Module) -> Iterator[None]:
    """transformers' Kimi-Linear with llama.cpp's epsilons: ``build_gdn_l2_norm`` is ``x / sqrt(sum x² +
    rms_norm_eps)`` (transformers: + 1e-6) and ``attn_kv_a_norm`` uses ``rms_norm_eps`` (transformers'
    ``kv_a_layernorm``: the RMSNorm default 1e-6)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as K

    eps = model.config.rms_norm_eps
    saved = (
        K.l2norm,
        {m: m.kv_a_layernorm.variance_epsilon for m in model.modules() if hasattr(m, "kv_a_layernorm")},
    )
    K.l2norm = lambda x, dim=-1, **_: x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)
    for m in saved[1]:
        m.kv_a_layernorm.variance_epsilon = eps
    try:
        yield
    finally:
        K.l2norm = saved[0]
        for m, e in saved[1].items():
            m.kv_a_layernorm.variance_epsilon = e


def hf_forward(hf: Path, ids: list[int]) -> dict:
    """transformers' logits ``[T, V]``, per layer the mixer output ``[T, d]`` and for MoE layers the top-k
    experts ``[T, k]`` and top-k margin ``[T]``; under ``"llama_eps"`` the same with llama.cpp's epsilons."""
    from transformers import KimiLinearForCausalLM
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearTopkRouter

    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = KimiLinearForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    rec: dict = {"mixer": {}, "topk": {}, "margin": {}, "llama_eps": {"mixer": {}, "topk": {}, "margin": {}}}
    cur = [rec]  # the dict the hooks fill
    for i, layer in enumerate(model.model.layers):

        def mixer(_m, _a, out, i=i) -> None:
            cur[0]["mixer"][i] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

        layer.self_attn.register_forward_hook(mixer)
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, KimiLinearTopkRouter):

            def router(mod, _a, out, i=i) -> None:
                choice = out[0].sigmoid() + mod.e_score_correction_bias  # [T, E]; one group, as built here
                top = choice.topk(mod.top_k + 1, dim=-1).values
                cur[0]["margin"][i] = top[:, mod.top_k - 1] - top[:, mod.top_k]
                cur[0]["topk"][i] = out[2].sort(-1).values

            gate.register_forward_hook(router)
    x = torch.tensor([ids])
    with torch.no_grad():
        rec["logits"] = model(x, use_cache=False).logits[0].float()  # no cache: all-KDA layouts need it
        cur[0] = rec["llama_eps"]
        with llama_cpp_eps(model):
            rec["llama_eps"]["logits"] = model(x, use_cache=False).logits[0].float()
    return rec


def longmoe_logits(lm: Path, ids: list[int]) -> torch.Tensor:
    from longmoe.checkpoint import load_model

    model, _, _ = load_model(lm)
    with torch.inference_mode():
        return model.float().eval()(torch.tensor([ids])).logits[0].float()


class _Head(ctypes.Structure):  # the leading fields of ggml.h's struct ggml_tensor
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4)]


def llama_forward(f32: Path, ids: list[int], kv_type: int, probe: tuple[str, ...] = ()) -> dict:
    """llama.cpp's logits ``[T, V]`` (one thread, one ubatch; KV cache of ggml type ``kv_type``) and the
    graph tensors whose names start with one of ``probe`` (``"ffn_moe_argsort-2"``: ``[T, E]``)."""
    import llama_cpp
    import llama_cpp.llama_cpp as lc

    got: dict[str, np.ndarray] = {}
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_get_name.restype, lib.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_nbytes.restype, lib.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    lib.ggml_is_contiguous.restype, lib.ggml_is_contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
    ]

    def on_eval(t, ask, _ud) -> bool:
        name = lib.ggml_get_name(t).decode()
        if not name.startswith(probe):
            return not ask
        head = _Head.from_address(t)
        dtype = {GGML_F32: np.float32, GGML_I32: np.int32}.get(head.type)
        if ask or dtype is None or not lib.ggml_is_contiguous(t):
            return True
        a = np.empty(lib.ggml_nbytes(t) // np.dtype(dtype).itemsize, dtype=dtype)
        lib.ggml_backend_tensor_get(t, a.ctypes.data, 0, a.nbytes)
        got[name] = a.reshape(len(ids), -1)  # ne = [row, n_tokens]: one row per token
        return True

    callback = lc.ggml_backend_sched_eval_callback(on_eval)
    default_params = lc.llama_context_default_params

    def with_callback():  # llama_cpp.Llama has no cb_eval argument
        p = default_params()
        if probe:
            p.cb_eval, p.cb_eval_user_data = callback, None
        return p

    lc.llama_context_default_params = with_callback
    try:
        llm = llama_cpp.Llama(model_path=str(f32), n_ctx=len(ids) + 8, n_threads=1, n_threads_batch=1,
                              n_batch=len(ids), n_ubatch=len(ids), logits_all=True, verbose=False,
                              type_k=kv_type, type_v=kv_type)  # fmt: skip
    finally:
        lc.llama_context_default_params = default_params
    try:
        llm.reset()
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[: len(ids)].copy())
    finally:
        llm.close()
    return {"logits": logits, **got}


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {
        "max_abs": float(d.max()),
        "median_abs": float(d.median()),
        "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    }


def routing(hf: dict, theirs: dict, margin: float, k: int) -> dict:
    """Every (layer, token) where llama.cpp's experts differ from transformers', with transformers' top-k
    margin there; and how many decisions are near-ties (margin under ``margin``)."""
    flips = []
    for i, ref in sorted(hf["topk"].items()):
        name = f"ffn_moe_argsort-{i}"
        if name not in theirs:
            return {"error": f"llama.cpp tensor {name} not captured"}
        mine = torch.from_numpy(theirs[name][:, :k].astype(np.int64)).sort(-1).values
        for t in (mine != ref).any(-1).nonzero().flatten().tolist():
            flips.append({"layer": i, "token": t, "margin": float(hf["margin"][i][t])})
    margins = torch.stack(list(hf["margin"].values()))
    return {
        "decisions": int(margins.numel()),
        "near_ties": int((margins < margin).sum()),
        "median_margin": float(margins.median()),
        "flips": flips,
    }


def mixer_drift(hf: dict, theirs: dict) -> list[dict]:
    """Per layer, ``|llama.cpp - transformers| / |transformers|`` of the mixer output (KDA or MLA)."""
    out = []
    for i, ref in sorted(hf["mixer"].items()):
        for kind in ("kda_out", "mla_out"):
            name = f"{kind}-{i}"
            if name in theirs:
                a = torch.from_numpy(theirs[name]).reshape(ref.shape)
                out.append(
                    {"layer": i, "mixer": kind[:3].upper(), "rel": float((a - ref).norm() / ref.norm())}
                )
    return out


def run_variant(workdir: Path, name: str, ids: list[int], margin: float) -> dict:
    paths = build(workdir, name)
    hf = hf_forward(paths["hf"], ids)
    ref, ref_eps = hf["logits"], hf["llama_eps"]["logits"]
    k = cpu_peer.kimi_shapes("quick")["num_experts_per_tok"]
    probe = ("ffn_moe_argsort-", "kda_out-", "mla_out-") if name == "base" else ()
    f16 = llama_forward(paths["f32"], ids, GGML_F16, probe)
    f32 = llama_forward(paths["f32"], ids, GGML_F32)
    row = {
        "what": VARIANTS[name][0],
        "logit_std": float(ref.std()),
        "longmoe_vs_transformers": compare(longmoe_logits(paths["longmoe"], ids), ref),
        "llama_cpp_vs_transformers": compare(f16["logits"], ref),
        "llama_cpp_f32kv_vs_transformers": compare(f32["logits"], ref),
        "llama_cpp_vs_transformers_llama_eps": compare(f16["logits"], ref_eps),
        "llama_cpp_f32kv_vs_transformers_llama_eps": compare(f32["logits"], ref_eps),
    }
    if hf["topk"]:
        near = torch.stack(list(hf["margin"].values()))
        row["near_ties"] = int((near < margin).sum())
        row["decisions"] = int(near.numel())
    if probe:
        row["routing"] = routing(hf, f16, margin, k)
        row["routing_llama_eps"] = routing(hf["llama_eps"], f16, margin, k)
        row["mixer_drift"] = mixer_drift(hf, f16)
        row["mixer_drift_llama_eps"] = mixer_drift(hf["llama_eps"], f16)
    print(name, {k: v for k, v in row.items() if not k.startswith(("routing", "mixer"))}, flush=True)
    return row


ROWS = (  # (json key, llama.cpp KV cache, reference)
    ("llama_cpp_vs_transformers", "f16", "transformers"),
    ("llama_cpp_f32kv_vs_transformers", "f32", "transformers"),
    ("llama_cpp_vs_transformers_llama_eps", "f16", "transformers, llama.cpp's eps"),
    ("llama_cpp_f32kv_vs_transformers_llama_eps", "f32", "transformers, llama.cpp's eps"),
)


def _notes(name: str, r: dict, suffix: str, against: str) -> list[str]:
    """The routing and per-layer drift sentences of one variant against one reference."""
    out = []
    c = r.get(f"routing{suffix}", {})
    if "flips" in c:
        flips = ", ".join(
            f"layer {f['layer']} token {f['token']} (margin {f['margin']:.1e})" for f in c["flips"]
        )
        out += ["", f"{name}: {c['near_ties']} of {c['decisions']} router decisions have a top-k margin "
                f"under the threshold (median {c['median_margin']:.1e}); llama.cpp (f16 KV) picks other "
                f"experts than {against} at: {flips or 'none'}."]  # fmt: skip
    if r.get(f"mixer_drift{suffix}"):
        drift = ", ".join(f"{d['layer']} {d['mixer']} {d['rel']:.1e}" for d in r[f"mixer_drift{suffix}"])
        out += ["", f"{name}: llama.cpp (f16 KV) vs {against}, mixer output relative L2 per layer: {drift}."]
    return out


def table(rows: dict, tokens: int) -> str:
    header = ["variant", "llama.cpp KV", "reference", "max |Δlogit|", "median |Δ|", "top-1"]
    body = []
    for name, r in rows.items():
        for key, kv, against in ROWS:
            q = r[key]
            body.append(
                [name, kv, against, f"{q['max_abs']:.2e}", f"{q['median_abs']:.2e}", f"{q['top1']:.3f}"]
            )
        q = r["longmoe_vs_transformers"]
        body.append([name, "(longmoe fp32)", "transformers", f"{q['max_abs']:.2e}", f"{q['median_abs']:.2e}",
                     f"{q['top1']:.3f}"])  # fmt: skip
    md = [f"llama.cpp f32 (and longmoe fp32) next-token logits on {tokens} ids against transformers fp32, "
          "as released and run with llama.cpp's epsilons (KDA q/k l2-norm and MLA kv_a_layernorm use "
          "rms_norm_eps); quick-shaped Kimi-Linear variants, random weights. "
          + "; ".join(f"{n}: {r['what']}, logit std {r['logit_std']:.3g}" for n, r in rows.items()) + ".",
          "", markdown_table(header, body)]  # fmt: skip
    for name, r in rows.items():
        for suffix, against in (("", "transformers"), ("_llama_eps", "transformers with llama.cpp's eps")):
            md += _notes(name, r, suffix, against)
    return "\n".join(md)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=512, help="token ids scored (default 512, as cpu_serve)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument(
        "--workdir", type=Path, default=None, help="where variants are built (default: a temp dir)"
    )
    p.add_argument(
        "--margin", type=float, default=1e-4, help="a router top-k margin under this is a near-tie"
    )
    p.add_argument("--no-write", action="store_true", help="print the table; leave bench/results alone")
    args = p.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; expected some of {list(VARIANTS)}")
    torch.set_num_threads(1)
    from bench.cpu_serve import ids_of

    ids = ids_of(args.tokens, 11)
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="cpu_parity-")
    workdir = args.workdir or Path(tmp.name)
    try:
        rows = {n: run_variant(workdir, n, ids, args.margin) for n in names}
    finally:
        if tmp is not None:
            tmp.cleanup()
    md = table(rows, args.tokens)
    payload = {"tokens": args.tokens, "margin": args.margin, "threads": 1, "variants": rows}
    if args.no_write:
        print(md)
    else:
        write_results("cpu_parity", payload, md, update_readme=False)


if __name__ == "__main__":
    main()
