"""The recipe's settings: the tiny model, the training budget, what is evaluated, the two controls.

Defaults are the full run (form_easy + form_varied; its target is form_varied field F1 >= 0.9 on
held-out renders: docs/vision.md "Results" says what these defaults reach); ``quick()`` is a smoke run
of seconds for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from longmoe.config import FFNConfig, ModelConfig, VisionConfig
from longmoe.configio import JsonConfig
from longmoe.data.tokenizer import MIN_VOCAB
from longmoe.tasks.documents import FAMILIES

VOCAB = MIN_VOCAB  # the character-level tokenizer (data.char_tokenizer)


@dataclass
class VisionExtractConfig(JsonConfig):
    # the model (a small dense-FFN LongMoE with a convolutional patch encoder)
    d_model: int = 64  # init_std 0.1 ~ 1/sqrt(d_model)
    n_layers: int = 2
    layer_pattern: str = "LM"
    heads: int = 2
    init_std: float = 0.1
    patch_size: int = 8
    # "conv": full-resolution convolutions, each patch's window a patch plus half a patch around it
    # (a glyph straddling patches is seen whole); "linear": one projection of a patch's pixels; "vit"
    encoder: str = "conv"
    conv_width: int = 64  # encoder="conv": patch feature channels (GLU MLP hidden 2x)
    conv_stem: int = 2  # encoder="conv": 3x3 convolutions of 16 channels at full resolution
    vit_width: int = 64  # encoder="vit" only: bidirectional layers over a page's patches
    vit_depth: int = 2
    vit_heads: int = 2
    max_image_side: int = 256
    # training (main model on images; the text-only control gets the same steps, batch and lr)
    # form_easy (glyphs on the patch grid) next to form_varied (the target: the same content, layout varied)
    mix: dict[str, float] = field(default_factory=lambda: {"form_easy": 1.0, "form_varied": 1.0})
    steps: int = 3000
    batch_size: int = 32
    # rows of each main-model batch that show their document as text instead of pixels: the copying
    # circuit learnt on text is then reused for patches once a glyph's patch embedding lines up with its
    # character's token embedding (0 = images only). The text control never sees images.
    text_rows: int = 0
    # weight of the patch-reading loss: each patch embedding, read through the output head, should
    # say the characters whose centre it holds (a space for none; data.reading_targets), so the
    # encoder writes a glyph where copying it is one attention step (0 = the answer loss alone)
    read_weight: float = 1.0
    lr: float = 1e-2
    warmup_steps: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    threads: int = 2
    checkpoint_every: int = 250  # steps between resumable checkpoints
    curve_every: int = 250  # steps between held-out probes (curve_n form_easy renders each)
    curve_n: int = 64
    # families of the held-out curve (curve_n pages split among them); empty = train.curve_family(rc)
    curve_families: list[str] = field(default_factory=list)
    # evaluation (held-out renders per family; families outside the mix are reported as measured)
    eval_families: list[str] = field(default_factory=lambda: list(FAMILIES))
    eval_n: int = 200
    eval_n_hard: int = 50  # per family not in the training mix
    target_family: str = "form_varied"  # the family whose held-out F1 is held against target_f1
    target_f1: float = 0.9
    # families each held against target_f1 in the report (empty = [target_family])
    target_families: list[str] = field(default_factory=list)
    text_control: bool = True
    control_steps: int = 0  # steps of the text-only control; 0 = the main model's (the same budget)
    # the control's input: "text_grid" (the text as a character grid through the same encoder, so each
    # character gets the row/column embeddings a patch gets; see eval/extract/textgrid.py) or "text"
    # (the plain text stream, no positions: the NoPE/KDA stack has nothing to address)
    control_inputs: str = "text_grid"
    # cells per side of the control's text grid (longer lines and more lines are cut): 32 holds form
    # lines; figure pages' text lines run to ~52 characters
    control_grid: int = 32
    # the control's own learning rate: each candidate is trained control_search_steps steps (0 = the
    # control's full budget, and the chosen run is the control) and scored on val_n VALIDATION pages
    # (seeds in the validation block, disjoint from training and test pages); the best F1 is kept
    control_lrs: list[float] = field(default_factory=lambda: [3e-3, 1e-2, 3e-2])
    control_search_steps: int = 300
    val_n: int = 64
    # families of the control's validation pages (val_n of each; empty = [target_family])
    val_families: list[str] = field(default_factory=list)
    # the interleaved-pretraining check: a text LM vs the same LM also fed image documents (False: skip,
    # e.g. an arm that varies only the image model)
    pretrain_check: bool = True
    pretrain_steps: int = 600
    pretrain_seq_len: int = 256
    pretrain_batch: int = 8
    pretrain_image_rows: int = 4  # image-document rows added to every mixed batch (text rows unchanged)
    pretrain_val_batches: int = 8
    pretrain_margin: float = 0.05  # nats/token the mixed model's text loss may exceed the text-only one

    def __post_init__(self) -> None:
        positive = ("d_model", "n_layers", "heads", "patch_size", "max_image_side", "steps", "batch_size",
                    "conv_width", "conv_stem", "control_grid",
                    "threads", "checkpoint_every", "curve_every", "curve_n", "eval_n", "eval_n_hard",
                    "pretrain_steps", "pretrain_seq_len", "pretrain_batch",
                    "pretrain_val_batches")  # fmt: skip
        for n in positive:
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{n}={v!r} is invalid: expected a positive integer")
        if self.d_model % (2 * self.heads):
            raise ValueError(
                f"d_model={self.d_model} is invalid: expected a multiple of 2 * heads={self.heads}"
            )
        if not self.mix or any(f not in FAMILIES or not w > 0 for f, w in self.mix.items()):
            raise ValueError(f"mix={self.mix} is invalid: expected positive weights of {list(FAMILIES)}")
        bad = [f for f in self.eval_families if f not in FAMILIES]
        if bad or not self.eval_families:
            raise ValueError(
                f"eval_families={self.eval_families} is invalid: expected names from {list(FAMILIES)}"
            )
        for n in ("curve_families", "val_families", "target_families"):
            if any(f not in FAMILIES for f in getattr(self, n)):
                raise ValueError(f"{n}={getattr(self, n)} is invalid: expected names from {list(FAMILIES)}")
        for n in ("lr", "init_std"):
            if not getattr(self, n) > 0:
                raise ValueError(f"{n}={getattr(self, n)!r} is invalid: expected a number > 0")
        if self.warmup_steps < 0 or self.pretrain_image_rows < 0 or self.weight_decay < 0:
            raise ValueError("warmup_steps, pretrain_image_rows and weight_decay must be >= 0")
        if not (isinstance(self.read_weight, (int, float)) and 0 <= self.read_weight < math.inf):
            raise ValueError(f"read_weight={self.read_weight!r} is invalid: expected a finite number >= 0")
        if self.control_inputs not in ("text", "text_grid"):
            raise ValueError(f"control_inputs={self.control_inputs!r} is invalid: expected text or text_grid")
        if any(not (isinstance(x, (int, float)) and x > 0) for x in self.control_lrs):
            raise ValueError(f"control_lrs={self.control_lrs} is invalid: expected numbers > 0")
        if self.control_search_steps < 0 or self.val_n < 1:
            raise ValueError("control_search_steps must be >= 0 and val_n >= 1")
        if self.target_family not in FAMILIES or not 0 < self.target_f1 <= 1:
            raise ValueError(f"target_family={self.target_family!r} / target_f1={self.target_f1} is invalid: "
                             f"expected a family of {list(FAMILIES)} and 0 < target_f1 <= 1")  # fmt: skip
        if self.control_steps < 0:
            raise ValueError(
                f"control_steps={self.control_steps} is invalid: expected >= 0 (0: same as steps)"
            )
        if not 0 <= self.text_rows < self.batch_size:
            raise ValueError(f"text_rows={self.text_rows} is invalid: expected 0 <= text_rows < batch_size")
        if not self.pretrain_margin > 0:
            raise ValueError(f"pretrain_margin={self.pretrain_margin!r} is invalid: expected a number > 0")
        self.model_config(vision=True)  # the model settings must make a valid ModelConfig

    def model_config(self, vision: bool = True) -> ModelConfig:
        head = self.d_model // self.heads
        return ModelConfig(
            vocab_size=VOCAB, d_model=self.d_model, n_layers=self.n_layers, layer_pattern=self.layer_pattern,
            max_seq_len=self.max_seq_len(), kda_heads=self.heads, kda_head_dim=head, kda_gate_rank=16,
            mla_heads=self.heads, mla_q_lora_rank=0, mla_kv_lora_rank=self.d_model, mla_head_dim=head,
            mla_v_head_dim=head, attn_res=False, attn_res_blocks=self.n_layers, init_std=self.init_std,
            ffn=FFNConfig(kind="dense", dense_hidden=2 * self.d_model),
            vision=self.vision_config() if vision else None,
        )  # fmt: skip

    def max_seq_len(self) -> int:
        """4096, or a largest page's patches + 1024 answer tokens where finer patches need more."""
        return max(4096, (self.max_image_side // self.patch_size) ** 2 + 1024)

    def targets(self) -> list[str]:
        """The families held against ``target_f1``."""
        return self.target_families or [self.target_family]

    def validation_families(self) -> list[str]:
        return self.val_families or [self.target_family]

    def vision_config(self) -> VisionConfig:
        size = {"patch_size": self.patch_size, "max_image_side": self.max_image_side}
        if self.encoder == "conv":
            return VisionConfig(**size, encoder="conv", width=self.conv_width, depth=self.conv_stem,
                                mlp_ratio=2, stem_channels=16)  # fmt: skip
        return VisionConfig(**size, encoder=self.encoder, width=self.vit_width, depth=self.vit_depth,
                            heads=self.vit_heads)  # fmt: skip

    def eval_count(self, family: str) -> int:
        return self.eval_n if family in self.mix else self.eval_n_hard


DOCUMENT_FAMILIES = ["form", "receipt", "table", "figure_page"]


def documents() -> VisionExtractConfig:
    """The four document families in one model (issue 55): equal weights, every family its own
    held-out F1 against the target, the curve and the control's validation pooled over the four.
    Its pages are 3-12x form_varied's patches, so batches are 16 pages and checkpoints frequent."""
    fams = list(DOCUMENT_FAMILIES)
    return VisionExtractConfig(
        mix=dict.fromkeys(fams, 1.0), batch_size=16, steps=600, checkpoint_every=100,
        curve_every=250, curve_n=32, curve_families=fams, eval_families=fams, eval_n=200,
        target_family="form", target_families=fams, val_families=fams, val_n=16,
        control_search_steps=100, control_grid=64, pretrain_steps=300, pretrain_image_rows=2, threads=1,
    )  # fmt: skip


PRESETS = {"forms": VisionExtractConfig, "documents": documents}


def quick() -> VisionExtractConfig:
    """A smoke run: a 32-wide model, a few steps of everything, a handful of held-out renders."""
    return VisionExtractConfig(
        d_model=32, steps=6, batch_size=4, checkpoint_every=3, curve_every=3, curve_n=4,
        eval_families=["form_easy", "receipt"], eval_n=4, eval_n_hard=2, target_family="form_easy",
        control_lrs=[1e-2, 3e-2], control_search_steps=2, val_n=2,
        pretrain_steps=3, pretrain_seq_len=64, pretrain_batch=2, pretrain_image_rows=2,
        pretrain_val_batches=2, threads=1,
    )  # fmt: skip
