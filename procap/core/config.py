"""Model and training configuration: dataclasses with named presets.

Presets follow the paper (docs/model.md): ``clevr``, ``spot``, ``edit`` at paper size, and ``tiny``
for CPU runs (tests, the demo). Look-up is by exact name; an unknown name raises ``KeyError`` with the
list of valid ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MASKING_SCHEMES = ("entire", "random_patch", "in_block", "out_of_block")
NEGATIVE_WARPS = ("batch_frame_swap", "frame_shuffle", "color_shift", "affine")
# The values of the ``variant`` field of files written before the authors' variant was grouped (AuthorsVariant):
# "procap", this library's model (the paper's description), or "authors", the authors' released architecture.
VARIANTS = ("procap", "authors")
ENC_ACTIVATIONS = ("gelu", "quick_gelu")
DIFFERENCE_MODES = ("absolute", "joint")
# Names shared by the library and the command line, kept here so a choice is written once.
GENERATED_FRAME_COUNTS = (3, 7, 15)  # l: recursive midpoints give 2^m - 1 frames
KEYFRAME_SAMPLING = ("topk", "multinomial")
FRAME_SIMILARITIES = ("vqgan", "dinov2", "scores")
LR_DECAYS = ("none", "cosine", "linear")
COMPUTE_DTYPES = ("fp32", "bf16", "fp16")
ABLATABLE_PARTS = ("queries", "change", "window")  # decoder-memory parts an inference-time ablation may hide
# Beam search's memory grows with the beams (every pair decodes num_beams rows, and each step ranks num_beams x
# vocabulary candidates): 2000 beams took 1.15 GB, 100000 were killed by the kernel. Captioners use 1 to 5; the
# bound leaves room for exhaustive searches of small vocabularies (the tests' takes 85).
MAX_BEAMS = 256
# Synthetic benchmark: how far the camera and light move between the two images of a pair (procap.data.synthetic).
VIEWPOINTS = ("none", "distractor", "strong")
# Stage-1 frame sources that need no procedure cache; any other --procedures value names a cache folder.
PROCEDURE_SOURCES = ("crossfade", "truth")
# `--vqgan untrained` (TrainConfig.vqgan): train on the preset's randomly initialised tokenizer, as asked for by name
# (smoke runs, timing); the command line never falls back to it by itself.
UNTRAINED_VQGAN = "untrained"
# What the demo trains stage 1 on: a source above, or "interpolated" (it builds a cache with procap prepare).
DEMO_PROCEDURES = ("interpolated", *PROCEDURE_SOURCES)
# The demo's models, (run folder, label): the cells of the paper's 2 x 2; the report names the same runs
# (procap.experiments.report.RUNS), and `procap demo --jobs` runs at most one process per model.
DEMO_MODELS = (
    ("procap", "ProCap (k=2)"),
    ("procap_no_stage1", "ProCap, no stage 1 (k=2)"),
    ("stage1_static", "stage 1, static pair (k=0)"),
    ("static", "static pair (k=0)"),
)
# Seeds of one demo: each trains the four models again (about 7.5 min with --quick, an hour or more without), so
# more than this is a typo rather than a study.
DEMO_MAX_SEEDS = 64


@dataclass
class VQGANConfig:
    """taming-transformers VQModel hyper-parameters (f16: 224 -> 14x14 latents)."""

    resolution: int = 224
    in_channels: int = 3
    out_ch: int = 3
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    # taming compares each level's resolution (224, 112, 56, 28, 14) with this list, so (16,) adds no level attention
    # for 224 px: the only attention block is mid.attn_1 at 14x14, as in the authors' vqgan.1024.224 checkpoint.
    attn_resolutions: tuple[int, ...] = (16,)
    z_channels: int = 256
    embed_dim: int = 256
    n_embed: int = 1024
    dropout: float = 0.0
    beta: float = 0.25  # commitment weight

    def __post_init__(self) -> None:
        self.ch_mult = tuple(self.ch_mult)
        self.attn_resolutions = tuple(self.attn_resolutions)

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def latent_size(self) -> int:
        return self.resolution // self.downsample_factor


def _floats(values: Iterable[float], count: int, name: str) -> tuple[float, ...]:
    """``values`` as a tuple of ``count`` floats: JSON round trips (checkpoint metadata) turn tuples into lists,
    and a config read back must compare equal to the one written."""
    floats = tuple(float(v) for v in values)
    if len(floats) != count:
        raise ValueError(f"{name} must be {count} numbers, got {floats}")
    return floats


def _two_floats(values: Iterable[float], name: str) -> tuple[float, float]:
    low, high = _floats(values, 2, name)
    return low, high


def _four_floats(values: Iterable[float], name: str) -> tuple[float, float, float, float]:
    first, second, third, fourth = _floats(values, 4, name)
    return first, second, third, fourth


@dataclass
class MaskingConfig:
    """Multi-granularity masking (paper Appendix C). Probabilities are over MASKING_SCHEMES in order."""

    scheme_probs: tuple[float, float, float, float] = (0.1, 0.7, 0.1, 0.1)
    patch_prob_range: tuple[float, float] = (0.2, 0.5)  # random-patch: mask prob p ~ U(lo, hi)
    block_area_range: tuple[float, float] = (0.2, 0.8)
    block_aspect_range: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self) -> None:
        self.scheme_probs = _four_floats(self.scheme_probs, "masking scheme_probs")
        self.patch_prob_range = _two_floats(self.patch_prob_range, "masking patch_prob_range")
        self.block_area_range = _two_floats(self.block_area_range, "masking block_area_range")
        self.block_aspect_range = _two_floats(self.block_aspect_range, "masking block_aspect_range")
        if abs(sum(self.scheme_probs) - 1.0) > 1e-6:
            raise ValueError(f"masking scheme_probs must be 4 probabilities summing to 1, got {self.scheme_probs}")


@dataclass
class Departures:
    """The ``tiny`` preset's departures from the paper (docs/model.md, "Departures"), all off in the paper presets.

    On in ``tiny``, where the measured CPU-budget runs need them. Each is an addition the paper's model does not
    have; with every field at its default the model is the paper's.
    """

    # A per-position |after - before| feature embedding added to every frame's tokens, and an init std scaled to
    # the width (0.02 at the paper's widths 768 / 512, larger when narrower).
    difference_embedding: bool = False
    width_scaled_init: bool = False
    # ``difference_visible_ends``: the difference embedding goes only to the before and after frames' tokens that
    # stage 1 leaves visible, never to a masked token or a procedure query. Off, it is added to every token after
    # masking, built from the unmasked ends: a masked end stays readable (MSM copies it) and every stage-2 query
    # carries the pair's difference by construction. On in ``tiny``; off reads older checkpoints as they were
    # trained (a file that does not name it predates it).
    difference_visible_ends: bool = False
    # Naming the changed object (docs/model.md): ``difference_mode`` "absolute" is LayerNorm(|after - before|) (its
    # first version), "joint" an MLP of the signed per-cell [before, after, after - before]; ``token_merge`` m folds
    # m x m latent cells into one encoder token (space to depth: the sequence shrinks m^2-fold, no cell is averaged
    # away); ``change_token`` appends one token pooled over the latent cells weighted by how much each changed.
    difference_mode: str = "absolute"
    token_merge: int = 1
    change_token: bool = False
    change_pixels: bool = False  # the change token also pools the raw pixels of each latent cell (before, after)
    # ``change_window`` w > 0 also appends the w x w latent cells around the strongest change as tokens of their
    # own (a pooled token keeps colour and material but loses shape and size); ``change_broadcast`` adds the change
    # token's encoder output to every memory token, so the decoder reads it whatever it attends to.
    change_window: int = 0
    change_broadcast: bool = False
    # ``pixel_cnn`` c > 0: a small CNN with c channels, trained with the captioner, reads the before and after
    # images and adds [before, after, after - before] of its features to every latent cell the change tokens read
    # (the frozen tokenizer keeps colour and size but blurs shape).
    pixel_cnn: int = 0
    # ``window_glimpse`` c > 0: a CNN with c channels reads the change window's pixels at full resolution (before,
    # after and their difference); its c features per window cell join that cell's token input: shape lives below
    # the cell's size.
    window_glimpse: int = 0
    standardize_features: bool = False  # per-channel running standardisation of the tokenizer's features
    # ``image_encoder`` c > 0: a CNN with c channels, trained with the captioner, reads every frame's image and gives
    # each latent cell c features of its own (a 1-2 px change of view moves the frozen tokenizer's codes in most
    # cells, docs/model.md); they join the frame's visual tokens, the joint difference and the change cells. It takes
    # pixel_cnn's place (the two are not combined).
    image_encoder: int = 0
    # ``learned_localisation``: the change token's pooling weights and the change window's centre come from a
    # learned score of every cell's change inputs added to the parameter-free one (temperature x rms of the frozen
    # features' difference), so they can follow the object when the whole view moved.
    learned_localisation: bool = False
    # ``restart_front_end``: stage 2, started from a stage-1 checkpoint, keeps its transformer stack, positions and
    # e_m and draws the front end (the input embeddings and CNNs before the stack) anew, as a run from scratch with
    # its seed would. Stage 1 trains that front end on masked images for its own tasks, and from there stage 2
    # detected 4.5 points fewer changes under viewpoint change (docs/model.md).
    restart_front_end: bool = False

    def check(self, latent_size: int) -> None:
        """Refuse a combination the model cannot build; ``latent_size`` bounds the change window."""
        if self.difference_mode not in DIFFERENCE_MODES:
            raise ValueError(f"difference_mode must be one of {DIFFERENCE_MODES}, got {self.difference_mode!r}")
        if self.change_window < 0 or self.change_window > latent_size:
            raise ValueError(f"change_window must be in [0, {latent_size}] latent cells, got {self.change_window}")
        if (self.change_window or self.change_broadcast or self.pixel_cnn) and not self.change_token:
            raise ValueError(
                "change_window, change_broadcast and pixel_cnn build on the change token: set change_token=True"
            )
        if self.pixel_cnn < 0:
            raise ValueError(f"pixel_cnn must be >= 0 channels, got {self.pixel_cnn}")
        if self.window_glimpse < 0:
            raise ValueError(f"window_glimpse must be >= 0 channels, got {self.window_glimpse}")
        if self.window_glimpse and not self.change_window:
            raise ValueError("window_glimpse reads the change window's pixels: set change_window > 0")
        if self.image_encoder < 0:
            raise ValueError(f"image_encoder must be >= 0 channels, got {self.image_encoder}")
        if self.image_encoder and self.pixel_cnn:
            raise ValueError("image_encoder takes pixel_cnn's place: set pixel_cnn=0")
        if self.learned_localisation and not self.change_token:
            raise ValueError("learned_localisation places the change token: set change_token=True")


DEPARTURE_FIELDS = frozenset(f.name for f in dataclasses.fields(Departures))


def nest_departures(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the departure flags written at the top level (configs saved before they were grouped, and
    keyword overrides such as ``get_preset("tiny", token_merge=2)``) moved into its ``departures`` entry.

    A flat flag overrides the same flag inside ``departures``; flags named nowhere keep :class:`Departures`'
    defaults, which is how a file from before a flag existed was trained.
    """
    flat = {name: value for name, value in data.items() if name in DEPARTURE_FIELDS}
    if not flat:
        return data
    nested = data.get("departures", {})
    if isinstance(nested, Departures):
        nested = dataclasses.asdict(nested)
    if not isinstance(nested, dict):
        return data  # a malformed entry: left for the type checks to name
    rest = {name: value for name, value in data.items() if name not in DEPARTURE_FIELDS}
    return {**rest, "departures": {**nested, **flat}}


@dataclass
class AuthorsVariant:
    """The architecture of the authors' released code and checkpoints (docs/model.md has the table of differences),
    ``ProCapConfig.authors``; built by ``procap convert --from authors``. At the defaults the model is the paper's.

    A stage-2 model: no stage-1 heads, the authors' decoder and decoding rule, and ``prefix_tokens`` learned vectors
    (their 24 caption slots and 2 control tokens) before the frames in the encoder sequence, with their mask quirk.
    Their encoder blocks are CLIP's, which is also why ``final_norm`` is off for them; CLIP's activation is
    ``ProCapConfig.enc_activation``, not a field here, because ``pretrain --init-encoder clip:`` sets it on the
    paper's model too.
    """

    enabled: bool = False
    prefix_tokens: int = 0
    final_norm: bool = True  # a LayerNorm after the last encoder block (CLIP's resblocks, the authors', have none)

    def check(self) -> None:
        """Refuse a prefix the variant cannot have: the authors' model needs its slots, the paper's has none."""
        if self.enabled != (self.prefix_tokens >= 2):
            raise ValueError(
                f"authors.prefix_tokens must be {'>= 2' if self.enabled else '0'} "
                f"{'with' if self.enabled else 'without'} authors.enabled, got {self.prefix_tokens}"
            )


# Older files name the authors' variant with these top-level fields (their names there -> AuthorsVariant's).
AUTHORS_FLAT_FIELDS = {"variant": "enabled", "enc_prefix_tokens": "prefix_tokens", "enc_final_norm": "final_norm"}


def nest_authors(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the authors' variant written at the top level (``variant``, ``enc_prefix_tokens``,
    ``enc_final_norm``: configs saved before it was grouped) moved into its ``authors`` entry.

    As in :func:`nest_departures`, a flat field overrides the same field inside ``authors`` and fields named nowhere
    keep :class:`AuthorsVariant`'s defaults; ``variant`` is one of :data:`VARIANTS`, read as ``enabled``.
    """
    flat = {AUTHORS_FLAT_FIELDS[name]: value for name, value in data.items() if name in AUTHORS_FLAT_FIELDS}
    if not flat:
        return data
    if "enabled" in flat:
        if not isinstance(flat["enabled"], str) or flat["enabled"] not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {flat['enabled']!r:.40}")
        flat["enabled"] = flat["enabled"] == "authors"
    nested = data.get("authors", {})
    if isinstance(nested, AuthorsVariant):
        nested = dataclasses.asdict(nested)
    if not isinstance(nested, dict):
        return data  # a malformed entry: left for the type checks to name
    rest = {name: value for name, value in data.items() if name not in AUTHORS_FLAT_FIELDS}
    return {**rest, "authors": {**nested, **flat}}


def nest_groups(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every grouped field its older files name at the top level moved into its group (departures,
    the authors' variant): how a config dict read from a file or given as overrides is read."""
    return nest_authors(nest_departures(data))


@dataclass
class ProCapConfig:
    """Everything that shapes the ProCap model (both stages)."""

    name: str = "custom"
    vqgan: VQGANConfig = field(default_factory=VQGANConfig)
    image_size: int = 224
    vocab_size: int = 80
    max_caption_len: int = 24  # tokens including BOS/EOS
    # procedure
    num_keyframes: int = 2  # k
    num_generated_frames: int = 7  # l
    # procedure encoder (pre-LN Transformer)
    enc_dim: int = 768
    enc_heads: int = 12
    enc_mlp: int = 3072
    enc_layers: int = 12
    enc_activation: str = "gelu"  # MLP activation; "quick_gelu" (x * sigmoid(1.702 x)) for CLIP-initialised blocks
    dropout: float = 0.1
    # The authors' released architecture instead of the paper's (off in every preset): one group, asked one question
    # (``authors.enabled``) wherever the model differs.
    authors: AuthorsVariant = field(default_factory=AuthorsVariant)
    # caption decoder
    dec_dim: int = 512
    dec_heads: int = 8
    dec_ffn: int = 2048
    dec_layers: int = 2
    label_smoothing: float = 0.1
    # Departures from the paper (docs/model.md), off in the paper presets, on in ``tiny``: one group, read in one
    # place of the model (``ProCap.departures``).
    departures: Departures = field(default_factory=Departures)
    # stage-1 losses and augmentations
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    msm_weight: float = 1.0
    align_weight: float = 1.0
    csy_weight: float = 1.0
    negative_probs: tuple[float, float, float, float] = (0.25, 0.25, 0.25, 0.25)  # over NEGATIVE_WARPS

    def __post_init__(self) -> None:
        if isinstance(self.vqgan, dict):
            self.vqgan = VQGANConfig(**self.vqgan)
        if isinstance(self.masking, dict):
            self.masking = MaskingConfig(**self.masking)
        if isinstance(self.departures, dict):
            self.departures = Departures(**self.departures)
        if isinstance(self.authors, dict):
            self.authors = AuthorsVariant(**self.authors)
        self.negative_probs = _four_floats(self.negative_probs, "negative_probs")
        if self.enc_dim % self.enc_heads or self.dec_dim % self.dec_heads:
            raise ValueError("enc_dim/dec_dim must be divisible by enc_heads/dec_heads")
        if self.num_keyframes < 0 or self.num_keyframes > self.num_generated_frames:
            raise ValueError(f"num_keyframes must be in [0, {self.num_generated_frames}], got {self.num_keyframes}")
        if self.enc_activation not in ENC_ACTIVATIONS:
            raise ValueError(f"enc_activation must be one of {ENC_ACTIVATIONS}, got {self.enc_activation!r}")
        self.departures.check(self.latent_size)
        self.authors.check()

    @property
    def latent_size(self) -> int:
        """VQGAN latent grid side (14 for 224 px with f16)."""
        return self.image_size // self.vqgan.downsample_factor

    @property
    def grid_size(self) -> int:
        """Encoder token grid side: the latent grid, or its m x m merged cells with ``token_merge`` m."""
        return self.latent_size // self.departures.token_merge

    @property
    def tokens_per_frame(self) -> int:
        """n_I: visual tokens per frame."""
        return self.grid_size**2

    @property
    def memory_tokens(self) -> int:
        """Decoder memory length: T * n_I, plus the change token and its window's cells when there are."""
        extra = self.departures
        return self.num_frames * self.tokens_per_frame + int(extra.change_token) + extra.change_window**2

    @property
    def num_frames(self) -> int:
        """Frames in the procedure sequence: before, k keyframes, after."""
        return self.num_keyframes + 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProCapConfig:
        """The config of ``data``, its grouped fields nested or (older files) at the top level (:func:`nest_groups`)."""
        data = nest_groups(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ProCapConfig fields: {sorted(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> ProCapConfig:
        """A copy with ``changes``; a departure flag may be named on its own (``replace(token_merge=2)``)."""
        if DEPARTURE_FIELDS & set(changes):
            changes = nest_departures({"departures": self.departures, **changes})
        return dataclasses.replace(self, **changes)


def _tiny_vqgan() -> VQGANConfig:
    # 64 px, f4 -> 16 x 16 latents (256 tokens per frame). The synthetic objects are 11-17 px wide: an 8 x 8 grid
    # (f8) mixes each with its neighbours and loses its colour and shape, a 16 x 16 grid keeps them (docs/model.md).
    return VQGANConfig(
        resolution=64,
        ch=32,
        ch_mult=(1, 2, 2),
        num_res_blocks=1,
        attn_resolutions=(16,),
        z_channels=64,
        embed_dim=64,
        n_embed=256,
    )


PRESETS: dict[str, ProCapConfig] = {
    "clevr": ProCapConfig(
        name="clevr", enc_layers=12, dec_layers=2, vocab_size=80, msm_weight=1.0, align_weight=1.0, csy_weight=1.0
    ),
    "spot": ProCapConfig(name="spot", enc_layers=4, dec_layers=3, vocab_size=834),
    "edit": ProCapConfig(name="edit", enc_layers=12, dec_layers=2, vocab_size=524),
    # LEVIR-CC (remote sensing, not in the paper): its 256 px images at f16 (16 x 16 latents), the clevr model
    # otherwise; captions of up to 38 words fit (RSICC drops longer ones at 50 tokens, few are above 30). No level
    # attention (256 px has a 16 x 16 level, 224 px none): the VQGAN stays the 224 px one, so its weights load.
    "levir": ProCapConfig(
        name="levir",
        vqgan=VQGANConfig(resolution=256, attn_resolutions=()),
        image_size=256,
        enc_layers=12,
        dec_layers=2,
        vocab_size=500,
        max_caption_len=40,
    ),
    "tiny": ProCapConfig(
        name="tiny",
        vqgan=_tiny_vqgan(),
        image_size=64,
        enc_dim=128,
        enc_heads=4,
        enc_mlp=512,
        enc_layers=2,
        dec_dim=128,
        dec_heads=4,
        dec_ffn=512,
        dec_layers=2,
        dropout=0.0,
        label_smoothing=0.0,
        departures=Departures(
            difference_embedding=True,
            width_scaled_init=True,
            difference_visible_ends=True,
            difference_mode="joint",
            token_merge=4,
            change_token=True,
            change_pixels=True,
            change_window=5,
            change_broadcast=True,
            window_glimpse=32,
            standardize_features=True,
            image_encoder=32,
            learned_localisation=True,
            restart_front_end=True,
        ),
    ),
}


def get_preset(name: str, **overrides: Any) -> ProCapConfig:
    """Return a fresh copy of the named preset, with optional field overrides."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}")
    base = PRESETS[name]
    return ProCapConfig.from_dict({**dataclasses.asdict(base), **overrides})


# ------------------------------------------------------------------------------------------- sanity bounds
# Configurations read from files (checkpoint metadata) are checked against these before any model is built: a
# crafted `enc_dim: 1000000` would otherwise try to allocate terabytes. The bounds are far above every preset.
_INT_BOUNDS: dict[type, dict[str, tuple[int, int]]] = {
    VQGANConfig: {
        "resolution": (8, 4096),
        "in_channels": (1, 16),
        "out_ch": (1, 16),
        "ch": (1, 4096),
        "num_res_blocks": (1, 16),
        "z_channels": (1, 16384),
        "embed_dim": (1, 16384),
        "n_embed": (2, 1_048_576),
    },
    ProCapConfig: {
        "image_size": (8, 4096),
        "vocab_size": (9, 1_048_576),
        "max_caption_len": (2, 1024),
        "num_keyframes": (0, 64),
        "num_generated_frames": (1, 64),
        "enc_dim": (1, 16384),
        "enc_heads": (1, 256),
        "enc_mlp": (1, 65536),
        "enc_layers": (1, 128),
        "dec_dim": (1, 16384),
        "dec_heads": (1, 256),
        "dec_ffn": (1, 65536),
        "dec_layers": (1, 128),
    },
    Departures: {
        "token_merge": (1, 16),
        "change_window": (0, 4096),
        "pixel_cnn": (0, 4096),
        "window_glimpse": (0, 4096),
        "image_encoder": (0, 4096),
    },
    AuthorsVariant: {"prefix_tokens": (0, 4096)},
}
_FLOAT_BOUNDS: dict[type, dict[str, tuple[float, float]]] = {
    VQGANConfig: {"dropout": (0.0, 1.0), "beta": (0.0, 1e6)},
    ProCapConfig: {
        "dropout": (0.0, 1.0),
        "label_smoothing": (0.0, 1.0),
        "msm_weight": (0.0, 1e6),
        "align_weight": (0.0, 1e6),
        "csy_weight": (0.0, 1e6),
    },
}
_TUPLE_BOUNDS: dict[type, dict[str, tuple[type, int, int, float, float]]] = {  # item type, length, value range
    VQGANConfig: {"ch_mult": (int, 1, 8, 1, 64), "attn_resolutions": (int, 0, 16, 1, 4096)},
    ProCapConfig: {"negative_probs": (float, 4, 4, 0.0, 1.0)},
    MaskingConfig: {
        "scheme_probs": (float, 4, 4, 0.0, 1.0),
        "patch_prob_range": (float, 2, 2, 0.0, 1.0),
        "block_area_range": (float, 2, 2, 0.0, 1.0),
        "block_aspect_range": (float, 2, 2, 0.01, 100.0),
    },
}


# The dataclass fields of ProCapConfig that are configs themselves, checked field by field under their name.
_SUB_CONFIGS: tuple[tuple[str, type], ...] = (
    ("vqgan", VQGANConfig),
    ("masking", MaskingConfig),
    ("departures", Departures),
    ("authors", AuthorsVariant),
)


def _is_number(value: Any, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        return False
    return kind is int or math.isfinite(value)


def _check_fields(cls: type, values: dict[str, Any], prefix: str) -> None:
    """Check the fields of ``cls`` present in ``values`` against the bounds tables; flags and names by type."""
    for f in dataclasses.fields(cls):
        kind = type(f.default) if isinstance(f.default, (bool, str)) else None
        if kind is not None and f.name in values and not isinstance(values[f.name], kind):
            raise ValueError(f"{prefix}{f.name} must be a {kind.__name__}, got {values[f.name]!r:.40}")
    for name, (low, high) in _INT_BOUNDS.get(cls, {}).items():
        value = values.get(name, low)
        if not _is_number(value, int) or not low <= value <= high:
            raise ValueError(f"{prefix}{name} must be an integer in [{low}, {high}], got {value!r:.40}")
    for name, (lowest, highest) in _FLOAT_BOUNDS.get(cls, {}).items():
        number = values.get(name, lowest)
        if not _is_number(number, float) or not lowest <= number <= highest:
            raise ValueError(f"{prefix}{name} must be a number in [{lowest:g}, {highest:g}], got {number!r:.40}")
    for name, (kind, shortest, longest, item_low, item_high) in _TUPLE_BOUNDS.get(cls, {}).items():
        items = values.get(name, (item_low,) * shortest)
        if (
            not isinstance(items, (tuple, list))
            or not shortest <= len(items) <= longest
            or not all(_is_number(v, kind) and item_low <= v <= item_high for v in items)
        ):
            count = shortest if shortest == longest else f"{shortest} to {longest}"
            raise ValueError(
                f"{prefix}{name} must be {count} numbers in [{item_low:g}, {item_high:g}], got {items!r:.60}"
            )


def check_config(config: VQGANConfig | ProCapConfig) -> None:
    """Check every size and rate of a configuration against generous sanity bounds (types included).

    Raises:
        ValueError: naming the first field out of bounds, e.g. ``enc_dim must be an integer in [1, 16384]``.
        TypeError: ``vqgan`` or ``masking`` is not a config object.
    """
    if isinstance(config, ProCapConfig):
        for name, kind in _SUB_CONFIGS:
            if not isinstance(getattr(config, name), kind):
                raise TypeError(f"{name} must be an object of {kind.__name__} fields")
            _check_fields(kind, vars(getattr(config, name)), f"{name}.")
        merge = config.departures.token_merge
        if config.image_size % (config.vqgan.downsample_factor * merge):
            raise ValueError(
                f"image_size {config.image_size} is not a multiple of the VQGAN's downsampling "
                f"factor {config.vqgan.downsample_factor} times token_merge {merge}"
            )
    _check_fields(type(config), vars(config), "")


def _build_checked(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object of {cls.__name__} fields, got {type(data).__name__}")
    if cls is ProCapConfig:
        data = nest_groups(data)  # a file written before the departures or the authors' variant were grouped
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)}, key=str)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {unknown[:5]}")
    _check_fields(cls, data, "")  # before construction: __post_init__ would fail on wrong types with no field name
    for name, kind in _SUB_CONFIGS:
        if cls is ProCapConfig and isinstance(data.get(name), dict):
            _check_fields(kind, data[name], f"{name}.")
    config = cls(**data)
    check_config(config)
    return config


def config_from_dict(cls: type, data: Any) -> Any:
    """``cls(**data)`` for a dict read from a file, checked by :func:`check_config` before and after construction.

    Raises:
        ValueError: for any defect (wrong type, unknown field, out of bounds), naming the field.
    """
    try:
        return _build_checked(cls, data)
    except (TypeError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(str(exc)) from None
