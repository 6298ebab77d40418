"""Every state-dict key and shape of the ``tiny`` preset and of the authors' variant, pinned: checkpoints and converted
weights are read by these names, so moving code between modules (the departures' own module, the encoder) must
leave them alone, and a renamed or reshaped key fails here. Built on the meta device: no weights are allocated."""

from __future__ import annotations

import hashlib

import pytest
import torch

from procap.core.config import ProCapConfig, get_preset
from procap.model.procap import ProCap

# The encoder block's and the decoders' layers, one entry per layer (``{i}`` its index).
ENCODER_LAYER = {
    "encoder.layers.{i}.norm1.weight": ("d",),
    "encoder.layers.{i}.norm1.bias": ("d",),
    **{f"encoder.layers.{{i}}.attn.{p}_proj.weight": ("d", "d") for p in "qkv"},
    **{f"encoder.layers.{{i}}.attn.{p}_proj.bias": ("d",) for p in "qkv"},
    "encoder.layers.{i}.attn.out_proj.weight": ("d", "d"),
    "encoder.layers.{i}.attn.out_proj.bias": ("d",),
    "encoder.layers.{i}.norm2.weight": ("d",),
    "encoder.layers.{i}.norm2.bias": ("d",),
    "encoder.layers.{i}.mlp.fc1.weight": ("mlp", "d"),
    "encoder.layers.{i}.mlp.fc1.bias": ("mlp",),
    "encoder.layers.{i}.mlp.fc2.weight": ("d", "mlp"),
    "encoder.layers.{i}.mlp.fc2.bias": ("d",),
}
PAPER_DECODER_LAYER = {
    **{f"decoder.layers.{{i}}.norm{n}.{p}": ("h",) for n in (1, 2, 3) for p in ("weight", "bias")},
    **{f"decoder.layers.{{i}}.{a}.{p}_proj.weight": ("h", "h") for a in ("self_attn", "cross_attn") for p in "qkv"},
    **{f"decoder.layers.{{i}}.{a}.{p}_proj.bias": ("h",) for a in ("self_attn", "cross_attn") for p in "qkv"},
    **{f"decoder.layers.{{i}}.{a}.out_proj.weight": ("h", "h") for a in ("self_attn", "cross_attn")},
    **{f"decoder.layers.{{i}}.{a}.out_proj.bias": ("h",) for a in ("self_attn", "cross_attn")},
    "decoder.layers.{i}.ffn.fc1.weight": ("ffn", "h"),
    "decoder.layers.{i}.ffn.fc1.bias": ("ffn",),
    "decoder.layers.{i}.ffn.fc2.weight": ("h", "ffn"),
    "decoder.layers.{i}.ffn.fc2.bias": ("h",),
}
AUTHORS_DECODER_LAYER = {  # post-LN, attention without biases
    **{
        f"decoder.layers.{{i}}.{a}.{p}_proj.weight": ("h", "h")
        for a in ("self_attn", "cross_attn")
        for p in ("q", "k", "v", "out")
    },
    **{f"decoder.layers.{{i}}.{n}_norm.{p}": ("h",) for n in ("self", "cross", "ffn") for p in ("weight", "bias")},
    "decoder.layers.{i}.ffn.fc1.weight": ("ffn", "h"),
    "decoder.layers.{i}.ffn.fc1.bias": ("ffn",),
    "decoder.layers.{i}.ffn.fc2.weight": ("h", "ffn"),
    "decoder.layers.{i}.ffn.fc2.bias": ("h",),
}

# ``tiny``: 64 px, 16 x 16 latents merged 4 x 4 into 4 x 4 tokens of 4 * 4 * 64 channels, width 128, every departure.
TINY = {
    "mask_embedding": (128,),
    "pos_frame": (4, 128),
    "pos_row": (4, 128),
    "pos_col": (4, 128),
    "encoder.visual_norm.weight": (1024,),
    "encoder.visual_norm.bias": (1024,),
    "encoder.visual_proj.weight": (128, 1024),
    "encoder.visual_proj.bias": (128,),
    "encoder.text_embed.weight": (80, 128),
    "encoder.text_pos": (24, 128),
    "encoder.align_token": (128,),
    "encoder.csy_token": (128,),
    "encoder.norm.weight": (128,),
    "encoder.norm.bias": (128,),
    # the departures (procap/model/departures.py), on the encoder itself
    "encoder.feature_norm.running_mean": (64,),
    "encoder.feature_norm.running_var": (64,),
    "encoder.feature_norm.num_batches_tracked": (),
    "encoder.image_encoder.layers.0.weight": (16, 3, 3, 3),
    "encoder.image_encoder.layers.0.bias": (16,),
    "encoder.image_encoder.layers.2.weight": (32, 16, 4, 4),
    "encoder.image_encoder.layers.2.bias": (32,),
    "encoder.image_encoder.layers.4.weight": (32, 32, 3, 3),
    "encoder.image_encoder.layers.4.bias": (32,),
    "encoder.image_encoder.layers.6.weight": (32, 32, 3, 3),
    "encoder.image_encoder.layers.6.bias": (32,),
    "encoder.image_norm.weight": (512,),
    "encoder.image_norm.bias": (512,),
    "encoder.image_proj.weight": (128, 512),
    "encoder.image_proj.bias": (128,),
    "encoder.difference_mlp.0.weight": (128, 4608),
    "encoder.difference_mlp.0.bias": (128,),
    "encoder.difference_mlp.2.weight": (128, 128),
    "encoder.difference_mlp.2.bias": (128,),
    "encoder.change_mlp.0.weight": (128, 384),
    "encoder.change_mlp.0.bias": (128,),
    "encoder.change_mlp.2.weight": (128, 128),
    "encoder.change_mlp.2.bias": (128,),
    "encoder.change_embedding": (128,),
    "encoder.change_temperature": (),
    "encoder.change_score.0.weight": (128, 384),
    "encoder.change_score.0.bias": (128,),
    "encoder.change_score.2.weight": (1, 128),
    "encoder.change_score.2.bias": (1,),
    "encoder.window_glimpse.layers.0.weight": (32, 9, 3, 3),
    "encoder.window_glimpse.layers.0.bias": (32,),
    "encoder.window_glimpse.layers.2.weight": (32, 32, 3, 3),
    "encoder.window_glimpse.layers.2.bias": (32,),
    "encoder.window_glimpse.layers.4.weight": (32, 32, 4, 4),
    "encoder.window_glimpse.layers.4.bias": (32,),
    "encoder.window_glimpse.layers.6.weight": (32, 32, 3, 3),
    "encoder.window_glimpse.layers.6.bias": (32,),
    "encoder.window_mlp.0.weight": (128, 416),
    "encoder.window_mlp.0.bias": (128,),
    "encoder.window_mlp.2.weight": (128, 128),
    "encoder.window_mlp.2.bias": (128,),
    "encoder.window_pos": (25, 128),
    # the stage-1 heads: a code per merged cell (16 x 256)
    "encoder.msm_head.0.weight": (128,),
    "encoder.msm_head.0.bias": (128,),
    "encoder.msm_head.1.weight": (4096, 128),
    "encoder.msm_head.1.bias": (4096,),
    "encoder.align_head.0.weight": (128,),
    "encoder.align_head.0.bias": (128,),
    "encoder.align_head.1.weight": (1, 128),
    "encoder.align_head.1.bias": (1,),
    "encoder.csy_head.0.weight": (128,),
    "encoder.csy_head.0.bias": (128,),
    "encoder.csy_head.1.weight": (1, 128),
    "encoder.csy_head.1.bias": (1,),
    "memory_mlp.0.weight": (128, 128),
    "memory_mlp.0.bias": (128,),
    "memory_mlp.2.weight": (128, 128),
    "memory_mlp.2.bias": (128,),
    "memory_mlp.3.weight": (128,),
    "memory_mlp.3.bias": (128,),
    "decoder.embed.weight": (80, 128),
    "decoder.pos_embed": (24, 128),
    "decoder.norm.weight": (128,),
    "decoder.norm.bias": (128,),
}

# The authors' released CLEVR-Change architecture: 224 px, 14 x 14 tokens, width 768, 26 prefix tokens, no final
# encoder LayerNorm, no stage-1 parts, their decoder (512 wide, post-LN layers, an output projection with a bias).
AUTHORS = {
    "mask_embedding": (768,),
    "pos_frame": (4, 768),
    "pos_row": (14, 768),
    "pos_col": (14, 768),
    "encoder.prefix": (26, 768),
    "encoder.visual_norm.weight": (256,),
    "encoder.visual_norm.bias": (256,),
    "encoder.visual_proj.weight": (768, 256),
    "encoder.visual_proj.bias": (768,),
    "memory_mlp.0.weight": (768, 768),
    "memory_mlp.0.bias": (768,),
    "memory_mlp.2.weight": (512, 768),
    "memory_mlp.2.bias": (512,),
    "memory_mlp.3.weight": (512,),
    "memory_mlp.3.bias": (512,),
    "decoder.out.weight": (80, 512),
    "decoder.out.bias": (80,),
}

# The VQGANs' keys (taming layout, their own tests): pinned by count and a digest of the sorted "name shape" lines.
VQGAN_DIGESTS = {
    "tiny": (183, "77a65a4436316a83ae669a75b37167ee5a8d95aa42a681e9dd870ee47b9eb832"),
    "authors": (293, "6bd3c3911124c80d1a01977091c398b7e20fde4b9b8586bbea60b4439e6d382d"),
}


def authors_released_config() -> ProCapConfig:
    """The shape of ``procap convert --from authors`` of their CLEVR-Change checkpoint."""
    return get_preset(
        "clevr",
        enc_activation="quick_gelu",
        authors={"enabled": True, "prefix_tokens": 26, "final_norm": False},
    )


def _layers(template: dict[str, tuple[str, ...]], count: int, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
    return {
        key.format(i=i): tuple(sizes[name] for name in shape) for i in range(count) for key, shape in template.items()
    }


def _shapes(config: ProCapConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = ProCap(config)
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def _check(name: str, shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    vqgan = sorted(f"{key} {shape}" for key, shape in shapes.items() if key.startswith("vqgan."))
    rest = {key: shape for key, shape in shapes.items() if not key.startswith("vqgan.")}
    assert sorted(set(rest) - set(expected)) == [], "keys the pin does not know (a rename?)"
    assert sorted(set(expected) - set(rest)) == [], "pinned keys the model lacks (a rename?)"
    assert {key: shape for key, shape in rest.items() if expected[key] != shape} == {}, "reshaped keys"
    count, digest = VQGAN_DIGESTS[name]
    assert (len(vqgan), hashlib.sha256("\n".join(vqgan).encode()).hexdigest()) == (count, digest), "\n".join(vqgan)


def test_tiny_keys_and_shapes_are_pinned():
    config = get_preset("tiny")
    expected = {
        **TINY,
        **_layers(ENCODER_LAYER, 2, {"d": 128, "mlp": 512}),
        **_layers(PAPER_DECODER_LAYER, 2, {"h": 128, "ffn": 512}),
    }
    _check("tiny", _shapes(config), expected)


def test_authors_variant_keys_and_shapes_are_pinned():
    config = authors_released_config()
    expected = {
        **AUTHORS,
        **_layers(ENCODER_LAYER, 12, {"d": 768, "mlp": 3072}),
        **_layers(AUTHORS_DECODER_LAYER, 2, {"h": 512, "ffn": 2048}),
    }
    _check("authors", _shapes(config), expected)


def test_the_pin_catches_a_renamed_key():
    shapes = _shapes(get_preset("tiny"))
    expected = {
        **TINY,
        **_layers(ENCODER_LAYER, 2, {"d": 128, "mlp": 512}),
        **_layers(PAPER_DECODER_LAYER, 2, {"h": 128, "ffn": 512}),
    }
    _check("tiny", shapes, expected)
    shapes["encoder.departures.window_pos"] = shapes.pop("encoder.window_pos")
    with pytest.raises(AssertionError, match="a rename"):
        _check("tiny", shapes, expected)
