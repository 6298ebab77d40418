"""VQGAN: taming key layout, strict checkpoint loading, quantizer maths, shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from procap.core.config import VQGANConfig, get_preset
from procap.core.errors import ProCapError
from procap.kernels.vq import vq_nearest_ref
from procap.model.vqgan import VQGAN, VectorQuantizer, attention_levels
from tests.support import small_vqgan_config


def test_attention_levels_follow_taming_nominal_resolution():
    # 224 nominal: 224, 112, 56, 28, 14 -- none is 16, so only the mid block attends (at 14x14).
    assert attention_levels(VQGANConfig()) == [False] * 5
    # taming's ImageNet f16 checkpoints (resolution 256): level 4 is the 16x16 one.
    assert attention_levels(VQGANConfig(resolution=256)) == [False, False, False, False, True]
    # the tiny preset (64 px, f4): 64, 32, 16 -- attention at the 16 x 16 level
    assert attention_levels(get_preset("tiny").vqgan) == [False, False, True]


def _paper_state_shapes(**overrides) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = VQGAN(VQGANConfig(**overrides))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_paper_key_layout_matches_taming_f16():
    shapes = _paper_state_shapes()
    expected = {
        "encoder.conv_in.weight": (128, 3, 3, 3),
        "encoder.down.0.block.1.norm2.weight": (128,),
        "encoder.down.2.block.0.nin_shortcut.weight": (256, 128, 1, 1),
        "encoder.down.3.downsample.conv.weight": (256, 256, 3, 3),
        "encoder.down.4.block.0.nin_shortcut.weight": (512, 256, 1, 1),
        "encoder.mid.block_1.conv1.weight": (512, 512, 3, 3),
        "encoder.mid.attn_1.proj_out.weight": (512, 512, 1, 1),
        "encoder.mid.block_2.norm1.bias": (512,),
        "encoder.norm_out.weight": (512,),
        "encoder.conv_out.weight": (256, 512, 3, 3),
        "quant_conv.weight": (256, 256, 1, 1),
        "quantize.embedding.weight": (1024, 256),
        "post_quant_conv.weight": (256, 256, 1, 1),
        "decoder.conv_in.weight": (512, 256, 3, 3),
        "decoder.mid.attn_1.q.weight": (512, 512, 1, 1),
        "decoder.up.4.block.2.conv2.weight": (512, 512, 3, 3),
        "decoder.up.4.upsample.conv.weight": (512, 512, 3, 3),
        "decoder.up.3.block.0.nin_shortcut.weight": (256, 512, 1, 1),
        "decoder.up.1.block.0.nin_shortcut.weight": (128, 256, 1, 1),
        "decoder.up.0.block.2.conv1.weight": (128, 128, 3, 3),
        "decoder.norm_out.weight": (128,),
        "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    for key, shape in expected.items():
        assert shapes.get(key) == shape, key
    absent = [
        "encoder.down.4.downsample.conv.weight",
        "decoder.up.0.upsample.conv.weight",
        "encoder.down.0.block.0.nin_shortcut.weight",
        "encoder.down.4.attn.0.q.weight",
        "decoder.up.4.attn.0.q.weight",
        "encoder.down.0.block.2.conv1.weight",
        "decoder.up.0.block.3.conv1.weight",
    ]
    for key in absent:
        assert key not in shapes, key
    assert not any(".temb" in k for k in shapes)
    assert sum(k.startswith("loss.") for k in shapes) == 0


def test_resolution_256_layout_has_level4_attention():
    shapes = _paper_state_shapes(resolution=256)
    assert shapes["encoder.down.4.attn.1.k.weight"] == (512, 512, 1, 1)
    assert shapes["decoder.up.4.attn.2.proj_out.weight"] == (512, 512, 1, 1)
    assert "encoder.down.4.attn.2.k.weight" not in shapes  # one per res block: 2 in the encoder, 3 in the decoder


def test_shapes_and_ranges():
    vqgan = VQGAN(small_vqgan_config()).eval()
    images = torch.rand(2, 3, 16, 16)
    assert vqgan.features(images).shape == (2, 32, 4, 4)
    codes = vqgan.codes(images)
    assert codes.shape == (2, 16) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < 64
    recon, vq_loss = vqgan(images)
    assert recon.shape == images.shape and vq_loss.dim() == 0
    quant, _, indices = vqgan.encode(images)
    assert quant.shape == (2, 16, 4, 4) and torch.equal(indices, codes)
    torch.testing.assert_close(vqgan.decode_codes(codes, 4, 4), vqgan.decode(quant))


def test_paper_architecture_downsamples_by_16():
    # The paper's f16 layout at reduced width: 112 px -> 7x7 (224 px -> 14x14).
    vqgan = VQGAN(VQGANConfig(ch=32, z_channels=8, embed_dim=8, n_embed=16)).eval()
    assert vqgan.features(torch.rand(1, 3, 112, 112)).shape == (1, 8, 7, 7)


def test_features_use_01_images_and_codes_use_2x_minus_1():
    vqgan = VQGAN(small_vqgan_config()).eval()
    images = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(vqgan.features(images), vqgan.encoder(images))
    z = vqgan.quant_conv(vqgan.encoder(2 * images - 1))  # (B, D, h, w)
    flat = z.permute(0, 2, 3, 1).reshape(-1, 16)  # row-major (h, w) positions
    expected = vq_nearest_ref(flat, vqgan.quantize.embedding.weight).view(2, 16)
    assert torch.equal(vqgan.codes(images), expected)


def test_quantizer_loss_and_straight_through():
    quantizer = VectorQuantizer(n_embed=8, embed_dim=4, beta=0.25)
    z = torch.randn(2, 4, 3, 3, requires_grad=True)
    z_q, loss, indices = quantizer(z)
    codes = quantizer.embedding.weight[indices.view(-1)].view(2, 3, 3, 4).permute(0, 3, 1, 2)
    torch.testing.assert_close(z_q, codes)
    # codebook term + beta * commitment term, both equal to the MSE in value
    torch.testing.assert_close(loss, 1.25 * F.mse_loss(z, codes))
    weights = torch.arange(z.numel(), dtype=torch.float32).view_as(z)
    (z_q * weights).sum().backward()
    torch.testing.assert_close(z.grad, weights)  # straight-through: dz_q/dz = identity
    z.grad = None
    loss.backward()  # only the commitment term reaches z: beta * 2 (z - e) / numel
    torch.testing.assert_close(z.grad, 0.25 * 2 * (z - codes).detach() / z.numel())
    assert quantizer.embedding.weight.grad.abs().sum() > 0  # the codebook term moves the codes


def test_reconstruction_training_step_reaches_every_part():
    vqgan = VQGAN(small_vqgan_config())
    losses = vqgan.reconstruction_loss(torch.rand(2, 3, 16, 16))
    torch.testing.assert_close(losses["loss"], losses["l1"] + losses["vq"])
    losses["loss"].backward()
    for name in (
        "encoder.conv_in.weight",
        "decoder.conv_out.weight",
        "quantize.embedding.weight",
        "quant_conv.weight",
        "post_quant_conv.weight",
    ):
        grad = dict(vqgan.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


# -- taming checkpoints ---------------------------------------------------------------------------------------------
def _save_taming(path, state: dict, **extra) -> None:
    torch.save({"state_dict": state, "global_step": 7, "epoch": 1, **extra}, path)


def _taming_state(vqgan: VQGAN) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in vqgan.state_dict().items()}
    state["loss.discriminator.main.0.weight"] = torch.randn(8, 3, 4, 4)  # GAN/LPIPS weights are ignored
    state["loss.perceptual_loss.lin0.model.1.weight"] = torch.randn(1, 64, 1, 1)
    state["loss.logvar"] = torch.zeros(())
    return state


def test_taming_checkpoint_round_trip(tmp_path):
    source = VQGAN(small_vqgan_config()).eval()
    path = tmp_path / "last.ckpt"
    _save_taming(path, _taming_state(source))
    loaded = VQGAN.from_taming_checkpoint(path, small_vqgan_config()).eval()
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    images = torch.rand(1, 3, 16, 16)
    assert torch.equal(loaded.codes(images), source.codes(images))


@pytest.mark.parametrize(
    "corruption, phrase",
    [
        ("missing", "1 missing: encoder.conv_out.bias"),
        ("shape", "wrong shape (file vs model): quantize.embedding.weight (32, 16) vs (64, 16)"),
        ("unexpected", "1 unexpected: decoder.extra.weight"),
    ],
)
def test_taming_checkpoint_mismatch_names_the_key(tmp_path, corruption, phrase):
    state = _taming_state(VQGAN(small_vqgan_config()))
    if corruption == "missing":
        del state["encoder.conv_out.bias"]
    elif corruption == "shape":
        state["quantize.embedding.weight"] = torch.randn(32, 16)
    else:
        state["decoder.extra.weight"] = torch.randn(3)
    path = tmp_path / "bad.ckpt"
    _save_taming(path, state)
    with pytest.raises(ProCapError, match="does not match the model") as info:
        VQGAN.from_taming_checkpoint(path, small_vqgan_config())
    assert phrase in str(info.value)


def test_attention_layout_mismatch_gets_a_hint(tmp_path):
    path = tmp_path / "res.ckpt"
    _save_taming(path, _taming_state(VQGAN(small_vqgan_config(resolution=32))))  # attention moves to level 2
    with pytest.raises(ProCapError, match="attention blocks differ"):
        VQGAN.from_taming_checkpoint(path, small_vqgan_config())


class _Callback:  # stands in for the Lightning objects a full training checkpoint pickles
    pass


def test_unsafe_or_malformed_files_raise(tmp_path):
    with pytest.raises(ProCapError, match="does not exist"):
        VQGAN.from_taming_checkpoint(tmp_path / "nope.ckpt")
    pickled = tmp_path / "pickled.ckpt"
    _save_taming(pickled, _taming_state(VQGAN(small_vqgan_config())), callbacks={"cb": _Callback()})
    with pytest.raises(ProCapError, match="cannot be read safely"):
        VQGAN.from_taming_checkpoint(pickled, small_vqgan_config())
    no_state = tmp_path / "weights.ckpt"
    torch.save({"model": {}}, no_state)
    with pytest.raises(ProCapError, match="no 'state_dict'"):
        VQGAN.from_taming_checkpoint(no_state, small_vqgan_config())
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(ProCapError, match="garbage.ckpt is not a torch checkpoint"):
        VQGAN.from_taming_checkpoint(garbage, small_vqgan_config())
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(ProCapError, match=r"empty.ckpt is empty\.$"):
        VQGAN.from_taming_checkpoint(tmp_path / "empty.ckpt", small_vqgan_config())
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(no_state.read_bytes()[:100])  # a zip archive cut short
    with pytest.raises(ProCapError, match="truncated.ckpt is not a torch checkpoint or is damaged"):
        VQGAN.from_taming_checkpoint(truncated, small_vqgan_config())
