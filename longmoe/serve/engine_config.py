"""The engine's options: scheduler, memory, prefix reuse and speculative decoding knobs (validated)."""

from __future__ import annotations

from dataclasses import dataclass

from longmoe.ops.quant import MODES as QUANT_MODES
from longmoe.serve.images import ImageLimits
from longmoe.validation import FLAG_MESSAGE, check, check_int_range, is_int

IMAGE_LIMITS = ("max_images", "max_image_bytes", "max_image_pixels")


@dataclass
class EngineConfig:
    """Scheduler and memory knobs (validated)."""

    prefill_chunk: int = 512  # prompt tokens fed per scheduler step (chunked prefill)
    max_batch: int = 32  # requests prefilling or decoding at once
    cache_budget_bytes: int = 1 << 30  # MLA latents + KDA states of all running requests
    block_size: int = 16  # tokens per accounting block of MLA latents
    max_waiting: int = 1024  # queued requests beyond which submissions are refused
    add_bos: bool = True  # text prompts start with <|bos|>, as training documents do
    device: str = "cpu"  # torch device to run on ("cpu", "cuda", "cuda:1", ...)
    # tokens a request may hold, prompt + completion; longer prompts are refused with an error. None:
    # the model's max_seq_len. Larger values are allowed on purpose: NoPE + KDA have no positional
    # limit (e.g. 1048576 for a 1M window), and extrapolation tests run past the window.
    max_context: int | None = None
    quantize: str | None = None  # "int8" | "int4": weight-only, applied to the model at construction
    quantize_head: bool = False  # with quantize: pack the LM head too (kept in float by default)
    compile: bool = False  # torch.compile the decode step (serve/compiled.py)
    # with compile: build the decode graphs in a background thread at start (eager steps until ready)
    compile_warmup: bool = True
    prefix_cache: bool = True  # reuse snapshots of earlier prompts' block-aligned prefixes
    # prefix reuse granularity: snapshots (recurrent states) every this many tokens, hits at its multiples
    # (or a finished request's exact end); a multiple of the model's KDA chunk (16) for states inside a
    # prefill chunk. Larger: fewer states (memory), more tokens re-prefilled per hit.
    prefix_block_size: int = 16
    draft_model: str | None = None  # model directory of a draft for speculative decoding (from_dir)
    num_speculative_tokens: int = 3  # tokens the draft proposes per step
    # images per request and per image (serve/images.py: checked before any pixel is decoded)
    max_images: int = 4
    max_image_bytes: int = 1 << 20
    max_image_pixels: int = 4096 * 4096

    def __post_init__(self) -> None:
        ints = ("prefill_chunk", "max_batch", "cache_budget_bytes", "block_size", "max_waiting")
        for f in (*ints, "prefix_block_size", "num_speculative_tokens", *IMAGE_LIMITS):
            check_int_range(f, getattr(self, f), 1, message=FLAG_MESSAGE)
        v = self.max_context
        ok = v is None or (is_int(v) and v >= 2)
        check(ok, "max_context", v, "None or an integer >= 2", message=FLAG_MESSAGE)
        q = self.quantize
        check(
            q is None or q in QUANT_MODES,
            "quantize",
            q,
            f"None or one of {QUANT_MODES}",
            message=FLAG_MESSAGE,
        )
        check(not self.quantize_head or q is not None, "quantize_head", self.quantize_head,
              "False unless quantize is set", message=FLAG_MESSAGE)  # fmt: skip

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(self.max_images, self.max_image_bytes, self.max_image_pixels)
