"""layers/vision.py: the encoder's shapes, batching, position signal and parameter formula."""

from __future__ import annotations

import pytest
import torch

from longmoe.config import VisionConfig
from longmoe.layers.vision import VisionEncoder
from longmoe.types import Patches


def patches(rows: int, cols: int, seed: int, p: int = 4) -> Patches:
    g = torch.Generator().manual_seed(seed)
    return Patches(torch.rand(rows * cols, 3 * p * p, generator=g), rows, cols)


def vcfg(encoder: str) -> VisionConfig:
    return VisionConfig(patch_size=4, max_image_side=32, encoder=encoder, width=32, depth=2, heads=4)


@pytest.mark.parametrize("encoder", ["linear", "vit"])
def test_param_count_matches_the_module(encoder):
    enc = VisionEncoder(vcfg(encoder), 48)
    assert VisionEncoder.param_count(vcfg(encoder), 48) == sum(p.numel() for p in enc.parameters())


@pytest.mark.parametrize("encoder", ["linear", "vit"])
def test_a_batch_of_sizes_equals_each_image_alone(encoder):
    """Images of different grids encoded together (ViT: padded + key mask) = each encoded alone."""
    torch.manual_seed(0)
    enc = VisionEncoder(vcfg(encoder), 48).eval()
    enc.init_weights(0.2)
    imgs = [patches(3, 5, 1), patches(8, 1, 2), patches(1, 1, 3)]
    with torch.no_grad():
        both = enc(imgs)
        alone = torch.cat([enc([p]) for p in imgs])
    assert both.shape == (15 + 8 + 1, 48)
    assert (both - alone).abs().max() < 1e-5
    assert enc([]).shape == (0, 48)


@pytest.mark.parametrize("encoder", ["linear", "vit"])
def test_identical_patches_at_different_places_differ(encoder):
    """The 2-D position signal: a uniform image's patches get distinct embeddings per (row, col), and
    a patch at (r, c) embeds the same in grids of different width (linear: exactly)."""
    torch.manual_seed(0)
    enc = VisionEncoder(vcfg(encoder), 48).eval()
    flat = Patches(torch.full((6, 48), 0.3), 2, 3)
    with torch.no_grad():
        e = enc([flat])
    assert torch.cdist(e, e).add(torch.eye(6) * 1e9).min() > 1e-4
    if encoder == "linear":
        wide = Patches(torch.full((10, 48), 0.3), 2, 5)
        with torch.no_grad():
            w = enc([wide])
        assert torch.allclose(e[3 + 1], w[5 + 1])  # row 1, col 1


def test_bad_patches_raise():
    enc = VisionEncoder(vcfg("linear"), 48)
    with pytest.raises(ValueError, match="patch grid"):
        enc([patches(9, 1, 0)])  # max_grid = 32 / 4 = 8
    with pytest.raises(ValueError, match=r"expected \[4, 48\]"):
        enc([Patches(torch.zeros(4, 47), 2, 2)])
    with pytest.raises(TypeError, match="expected Patches"):
        enc([torch.zeros(4, 48)])
