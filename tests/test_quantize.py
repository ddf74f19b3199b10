"""Weight-only quantization of a model (longmoe/quantize.py): the swap is exactly the dequantized model,
logits stay close to fp32 (tolerances below), bytes shrink as the formats say, inspect's footprint
equals the real one, and the flagship's footprint is reported without allocating it."""

from __future__ import annotations

import pytest
import torch

from longmoe.layers.mla import MLALayer
from longmoe.layers.quant import QuantExperts, QuantLinear
from longmoe.model import LongMoE
from longmoe.ops.quant import dequantize
from longmoe.presets import preset
from longmoe.quantize import KEEP_FLOAT, plan, quantize_model, quantized_footprint, weight_bytes

# relative L2 error of the logits of the fp32 tiny preset at init, quantized (bf16 compute) vs fp32.
# Measured: int8 0.040, int4 0.39 (group 32); for scale, the same model cast to bf16 is off by 0.029.
# A random 8-layer model amplifies weight noise through its depth, so this whole-model bound is loose;
# the per-layer bounds below are the ones a wrong scale, zero point or packing cannot pass.
LOGIT_REL_TOL = {"int8": 0.06, "int4": 0.6}

# Per layer, relative L2 error of one quantized projection's output (or one expert's weight) against
# its float weight. Rounding to a grid of step s puts uniform noise of RMS s/sqrt(12) on each weight:
# int8 (s = max|row| / 127) gives ~0.0065 on these Gaussian-initialised rows (measured worst 0.0066),
# int4 (s = range of a group of 32 / 15) ~0.085 (measured worst 0.085). A scale off by 2x, a shifted
# zero point or a mis-packed row gives errors of order 1.
LAYER_REL_TOL = {"int8": 0.012, "int4": 0.13}


def _tiny(**kw) -> LongMoE:
    torch.manual_seed(0)
    return LongMoE(preset("tiny").replace(**kw)).eval()


def _ids(B: int = 2, T: int = 80) -> torch.Tensor:
    return torch.randint(0, 2048, (B, T), generator=torch.Generator().manual_seed(0))


def _dequantized_float_model(q: LongMoE, **kw) -> LongMoE:
    """A float model whose weights are the quantized model's weights, dequantized."""
    f = _tiny(**kw)
    with torch.no_grad():
        for name, mod in q.named_modules():
            if isinstance(mod, QuantLinear):
                f.get_submodule(name).weight.copy_(dequantize(mod.packed))
            elif isinstance(mod, QuantExperts):
                moe = f.get_submodule(name.rsplit(".", 1)[0])
                for w, qw in zip((moe.w_in, moe.w_out), mod.packed(), strict=True):
                    w.copy_(
                        torch.stack([dequantize(qw.expert(e)) for e in range(w.shape[0])]).transpose(1, 2)
                    )
    return f


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_model_is_its_dequantized_weights_and_close_to_fp32(mode):
    x = _ids()
    with torch.no_grad():
        ref = _tiny()(x).logits
        exact = _tiny()
        quantize_model(exact, mode, compute_dtype=torch.float32)
        fake = _dequantized_float_model(exact)(x).logits
        # with fp32 compute the kernels add nothing but rounding on top of the quantization itself
        torch.testing.assert_close(exact(x).logits, fake, atol=1e-4, rtol=1e-4)
        q = _tiny()
        quantize_model(q, mode)  # the default: bf16 compute
        out = q(x).logits
    assert out.dtype == torch.float32
    rel = float((out - ref).norm() / ref.norm())
    assert rel < LOGIT_REL_TOL[mode], rel


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_every_quantized_layer_is_within_its_rounding_error(mode):
    m = _tiny()
    floats = {
        n: (mod.weight.detach().clone(), mod.bias)
        for n, mod in m.named_modules()
        if isinstance(mod, torch.nn.Linear)
    }
    experts = {
        n: (mod.w_in.detach().clone(), mod.w_out.detach().clone())
        for n, mod in m.named_modules()
        if mod in list(m.moe_layers())
    }
    quantize_model(m, mode, compute_dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    errors = {}
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, QuantLinear):
                w, b = floats[name]
                x = torch.randn(16, w.shape[1], generator=gen)  # [16, K]
                ref = x @ w.T + (0 if b is None else b)
                errors[name] = float((mod(x) - ref).norm() / ref.norm())
            elif isinstance(mod, QuantExperts):
                moe_name = name.rsplit(".", 1)[0]
                for w, qw in zip(experts[moe_name], mod.packed(), strict=True):  # w: [E, K, N]
                    for e in range(w.shape[0]):
                        got = dequantize(qw.expert(e)).T
                        errors[f"{moe_name}.expert{e}"] = float((got - w[e]).norm() / w[e].norm())
    assert len(errors) > 50
    worst = max(errors, key=errors.get)
    assert errors[worst] < LAYER_REL_TOL[mode], (worst, errors[worst])


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_what_is_quantized_and_what_is_kept(mode):
    m = _tiny(tie_embeddings=False)
    p = quantize_model(m, mode)
    kinds = {type(mod) for mod in m.modules()}
    assert QuantLinear in kinds and QuantExperts in kinds
    for name in p.kept:
        lin = m.get_submodule(name)
        assert isinstance(lin, torch.nn.Linear)
        assert name.rsplit(".", 1)[-1] in KEEP_FLOAT or (mode == "int4" and lin.in_features % 32)
    assert len(p.experts) == sum(m.cfg.is_moe_layer(i) for i in range(m.cfg.n_layers))
    for moe in m.moe_layers():
        assert moe.w_in is None and moe.w_out is None and "w_in" not in dict(moe.named_parameters())
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(m, mode)
    with pytest.raises(ValueError, match="quantize: expected one of"):
        plan(_tiny(), "int2")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_bytes_shrink_as_expected_and_footprint_matches(dtype):
    """int8 packs each quantized weight into 1 byte (+ a scale per row), int4 into half a byte (+ two
    numbers per group of 32); ``quantized_footprint`` (meta device) equals the real bytes."""
    cfg = preset("tiny").replace(dtype=dtype)
    full = weight_bytes(_tiny(dtype=dtype))
    assert full == quantized_footprint(cfg, None)
    eb = 4 if dtype == "float32" else 2  # bytes of a float weight; scales are bf16 (the compute dtype)
    for mode, per_weight in (("int8", 1.0), ("int4", 0.5)):
        m = _tiny(dtype=dtype)
        p = plan(m, mode)
        n_quant = sum(m.get_submodule(n).weight.numel() for n in p.linears)
        n_quant += sum(mm.w_in.numel() + mm.w_out.numel() for mm in m.moe_layers())
        quantize_model(m, mode)
        got = weight_bytes(m)
        assert got == quantized_footprint(cfg, mode)
        assert got["float"] == full["total"] - n_quant * eb
        overhead = got["quantized"] / n_quant - per_weight  # scales (and zeros), int4 row padding
        assert 0 < overhead < (0.05 if mode == "int8" else 0.25), overhead  # bytes per weight


def test_flagship_footprint_without_allocating():
    """The flagship (2.8T parameters, bf16) quantizes to about 1/2 (int8) and 1/4-ish (int4) of its bytes."""
    cfg = preset("flagship")
    full = quantized_footprint(cfg, None)["total"]
    i8, i4 = (quantized_footprint(cfg, m)["total"] for m in ("int8", "int4"))
    assert 0.5 < i8 / full < 0.52 and 0.25 < i4 / full < 0.33


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_shared_key_projection_is_quantized_and_decodes_exactly(mode):
    """With mla_shared_key_dim the MLA in_proj (which holds the shared key rows next to the latent's) is
    quantized like the rest: the swap is exactly its dequantized model, and prefill + decode through the
    cache equals the quantized full forward."""
    kw = dict(mla_shared_key_dim=16)
    x = _ids(2, 24)
    with torch.no_grad():
        q = _tiny(**kw)
        quantize_model(q, mode, compute_dtype=torch.float32)
        mlas = [m for m in q.modules() if isinstance(m, MLALayer)]
        assert mlas and all(isinstance(m.in_proj, QuantLinear) for m in mlas)
        assert mlas[0].in_proj.out_features == sum(mlas[0].splits)  # q | latent + shared key | gate
        full = q(x).logits
        torch.testing.assert_close(full, _dequantized_float_model(q, **kw)(x).logits, atol=1e-4, rtol=1e-4)
        cache = q.new_cache(2)
        steps = [q(x[:, :16], cache=cache).logits]
        steps += [q(x[:, t : t + 1], cache=cache).logits for t in range(16, 24)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_vision_encoder_quantizes_and_still_encodes(mode):
    """A vision model's encoder projections are quantized like the text stack's (the position tables
    stay float) and images still run end to end, close to the float model."""
    from longmoe.layers.vision import Patches

    torch.manual_seed(0)
    m = LongMoE(preset("tiny-vision")).eval()
    p = Patches(torch.rand(6, 192), 2, 3)
    x = torch.tensor([[1, 50, 9] + [11] * 6 + [10, 60]])
    with torch.no_grad():
        ref = m(x, image_embeds=m.encode_images([p])).logits
        done = quantize_model(m, mode)
        got = m(x, image_embeds=m.encode_images([p])).logits
    assert "vision.patch_proj" in done.linears and isinstance(m.vision.blocks[0].qkv, QuantLinear)
    assert (got.float() - ref).abs().max() < 0.2 * ref.abs().max()


def test_quantize_head_packs_the_lm_head_and_stays_close():
    """``head=True`` packs the untied LM head too (the head is its dequantized weight), the footprint
    counts it, and the logits stay within the int8 bound; without a quantize mode the engine refuses it."""
    from longmoe.serve.engine_config import EngineConfig

    ids = _ids()
    with torch.no_grad():
        ref = _tiny(tie_embeddings=False)(ids).logits
        m = _tiny(tie_embeddings=False)
        p = quantize_model(m, "int8", head=True)
        assert "lm_head" in p.linears and isinstance(m.lm_head, QuantLinear)
        assert weight_bytes(m) == quantized_footprint(m.cfg, "int8", head=True)
        assert weight_bytes(m)["total"] < quantized_footprint(m.cfg, "int8")["total"]
        got = m(ids).logits
        exact = _dequantized_float_model(m, tie_embeddings=False)(ids).logits
    torch.testing.assert_close(got, exact, atol=0.05, rtol=0.05)  # bf16 compute of the same weights
    assert (got - ref).norm() / ref.norm() < LOGIT_REL_TOL["int8"]
    with pytest.raises(ValueError, match="quantize_head"):
        EngineConfig(quantize_head=True)
