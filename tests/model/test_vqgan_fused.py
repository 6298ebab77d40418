"""The fast VQGAN encoder (bias-free convolutions, 4x4 downsample, merged q/k/v, 8-channel input) against the model's.

The reference is :class:`procap.model.vqgan.Encoder` itself; the fast path must give its output (fp32: 1e-5
relative; bf16: within the bf16 model's own error against fp32) and must never hand a convolution a bias.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from procap import kernels
from procap.core.config import VQGANConfig
from procap.core.errors import ProCapError
from procap.kernels.groupnorm import GROUP_NORM_OPS, GROUP_NORM_PATHS
from procap.model.vqgan import VQGAN
from procap.model.vqgan_fused import FusedVQGANEncoder, downsample_weight_4x4
from tests.support import DTYPES, impl_device, requires_triton

# f4 on 16 px: two chained blocks per level, attention after each block of level 1 (nominal 8 px), a 1x1 shortcut
# where level 2 doubles the width, two downsamples and the mid block.
CONFIG = VQGANConfig(
    resolution=16, ch=32, ch_mult=(1, 1, 2), num_res_blocks=2, attn_resolutions=(8,), z_channels=32, embed_dim=16
)


pytestmark = pytest.mark.usefixtures("fresh_dispatch")


def _encoder(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    encoder = VQGAN(CONFIG).encoder.eval()
    with torch.no_grad():  # random biases: taming's init leaves them small, which would hide a missing one
        for module in encoder.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.bias.normal_(0.0, 0.5)
    return encoder


class _ConvolutionLog(TorchDispatchMode):
    """Records every aten op name and, per convolution, whether it was handed a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.conv_biases: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if name in ("convolution", "_convolution", "mkldnn_convolution", "conv2d"):
            self.conv_biases.append(args[2] is not None)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("size", [16, 17, 10], ids=lambda s: f"{s}px")
def test_4x4_downsample_is_exact_in_fp64(size):
    torch.manual_seed(size)
    x = torch.randn(2, 16, size, size, dtype=torch.float64)
    w3 = torch.randn(16, 16, 3, 3, dtype=torch.float64)
    padded = F.conv2d(F.pad(x, (0, 1, 0, 1)), w3, stride=2)
    extended = F.conv2d(x, downsample_weight_4x4(w3), stride=2, padding=1)
    assert extended.shape == padded.shape
    torch.testing.assert_close(extended, padded, rtol=0, atol=1e-12)  # the same taps: only summation order differs


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("downsample_4x4", [True, False], ids=["down4x4", "pad+3x3"])
def test_fp32_output_equals_the_model_encoder(channels_last, downsample_4x4):
    encoder = _encoder()
    fused = FusedVQGANEncoder(encoder, downsample_4x4=downsample_4x4, channels_last=channels_last)
    images = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        ref, got = encoder(images), fused(images)
    assert got.shape == ref.shape == (3, 32, 4, 4)
    assert (got - ref).norm() <= 1e-5 * ref.norm()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_no_convolution_gets_a_bias_and_nothing_is_padded():
    encoder = _encoder()
    fused = FusedVQGANEncoder(encoder)
    images = torch.rand(1, 3, 16, 16)
    with torch.no_grad(), _ConvolutionLog() as reference_log:
        encoder(images)
    with torch.no_grad(), _ConvolutionLog() as fused_log:
        fused(images)
    assert any(reference_log.conv_biases) and "constant_pad_nd" in reference_log.ops  # what the check would catch
    assert fused_log.conv_biases and not any(fused_log.conv_biases)
    assert "constant_pad_nd" not in fused_log.ops
    # conv_in, 2 per residual block (3 levels x 2 + the mid block's 2), 2 downsamples, conv_out; 1x1s are GEMMs
    assert len(fused_log.conv_biases) == 1 + 2 * 8 + 2 + 1


def test_shares_the_modules_and_keys():
    encoder = _encoder()
    fused = FusedVQGANEncoder(encoder)
    assert list(fused.state_dict()) == list(encoder.state_dict())
    assert fused.conv_in is encoder.conv_in and fused.reference is encoder
    assert fused.conv_in_weight.shape == (32, 8, 3, 3) and not fused.conv_in_weight[:, 3:].any()
    with pytest.raises(RuntimeError, match="inference"):
        fused.train()(torch.rand(1, 3, 16, 16))


@requires_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group_norm", GROUP_NORM_PATHS)
def test_triton_path_matches_the_reference(dtype, group_norm, monkeypatch):
    # The fused path with the Triton kernels (on a GPU, or interpreted on CPU tensors): in_bias norms, the bias +
    # shortcut add, every GroupNorm path (on 16 px every norm fits the single kernel). The fp64 truth is computed on
    # the CPU, where every build has fp64 convolutions.
    device = impl_device("triton")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # fp32 convolutions in fp32 on a GPU too
    encoder = _encoder()
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        truth = encoder.double()(images.double())
        encoder.to(device, dtype)
        eager = encoder(images.to(device, dtype)).cpu()
        monkeypatch.setenv("PROCAP_KERNELS", "triton")
        kernels.reset_dispatch()
        got = FusedVQGANEncoder(encoder, channels_last=True, group_norm=group_norm)(images.to(device, dtype)).cpu()
    assert kernels.chosen_impl(GROUP_NORM_OPS[group_norm], device, dtype) == "triton"
    assert kernels.chosen_impl("bias_add", device, dtype) == "triton"
    err, eager_err = ((t.double() - truth).norm() / truth.norm() for t in (got, eager))
    if dtype == torch.float32:
        assert err <= 1e-5
    else:  # the fused path rounds less often than the eager bf16 model; allow it the same error and some slack
        assert err <= 2 * eager_err + 1e-3, (err, eager_err)


def test_a_group_norm_path_that_does_not_exist_is_refused_in_one_sentence():
    with pytest.raises(ProCapError, match=r"group_norm option must be one of chunked, persistent, single_kernel"):
        VQGAN(CONFIG).eval().use_fused(group_norm="fastest")


def test_the_zero_taps_would_inflate_a_flop_count():
    # Why benchmarks count model FLOPs on the reference encoder (bench/test_e2e.py passes fused_vqgan=False): the
    # 4x4 downsample and the 8-channel conv_in multiply zeros that a FLOP counter cannot tell from work.
    from torch.utils.flop_counter import FlopCounterMode

    encoder = _encoder()
    images = torch.rand(1, 3, 16, 16)
    counts = []
    for module in (encoder, FusedVQGANEncoder(encoder)):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(images)
        counts.append(counter.get_total_flops())
    assert counts[1] > counts[0]


def test_the_vqgan_chooses_its_encoder_form():
    torch.manual_seed(0)
    vqgan = VQGAN(CONFIG).eval()
    images = torch.rand(2, 3, 16, 16)
    keys = set(vqgan.state_dict())
    with torch.no_grad():
        readable = vqgan.features(images)
        vqgan.use_fused(channels_last=True)
        assert isinstance(vqgan.encoder, FusedVQGANEncoder) and vqgan.encoder.channels_last
        assert set(vqgan.state_dict()) == keys  # the fused form shares the modules: no new or lost keys
        fused = vqgan.features(images)
        vqgan.use_fused(downsample_4x4=False)  # chosen again: built from the readable encoder, not nested
        assert vqgan.encoder.reference is vqgan.reference_encoder and not vqgan.encoder.downsample_4x4
        vqgan.use_fused(False)
        assert vqgan.encoder is vqgan.reference_encoder
        again = vqgan.features(images)
    assert ((fused - readable).norm() / readable.norm()) <= 1e-5
    assert torch.equal(again, readable)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3], ids=lambda b: f"b{b}")
def test_conv_in_stats_gives_the_encoders_output(dtype, batch, monkeypatch):
    # The option on against off, both through the Triton kernels (interpreted on a CPU), at an odd size: conv_in and
    # the first norm's statistics in one kernel must leave the encoder's output as it was, up to rounding.
    device = impl_device("triton")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    encoder = _encoder()
    with torch.no_grad():  # norms that differ from one another: the first norm's must be the one applied
        for module in encoder.modules():
            if isinstance(module, torch.nn.GroupNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.5)
    images = torch.rand(batch, 3, 17, 17)
    with torch.no_grad():
        truth = encoder.double()(images.double())
        encoder.to(device, dtype)
        monkeypatch.setenv("PROCAP_KERNELS", "triton")
        kernels.reset_dispatch()
        off = FusedVQGANEncoder(encoder, channels_last=True)(images.to(device, dtype)).cpu()
        fused = FusedVQGANEncoder(encoder, channels_last=True, conv_in_stats=True)
        assert fused.conv_in_weight.shape[1] == 3  # the images' own channels: no padded copy
        assert fused.downsample_weight_0.is_contiguous(memory_format=torch.channels_last)  # the others' layout kept
        with _ConvolutionLog() as log:
            on = fused(images.to(device, dtype)).cpu()
    assert kernels.chosen_impl("conv_in_norm", device, dtype) == "triton"
    assert len(log.conv_biases) == 2 * 8 + 2 + 1  # conv_in is no aten convolution any more
    assert on.shape == off.shape == truth.shape
    err_on, err_off = ((t.double() - truth).norm() / truth.norm() for t in (on, off))
    if dtype == torch.float32:
        assert err_on <= 1e-5
    else:  # the summation order of one convolution changes; allow what the option-off path errs, and some slack
        assert err_on <= 2 * err_off + 1e-3, (err_on, err_off)


def test_conv_in_stats_with_grad_runs_the_reference():
    # Inference only: with parameters that require grad the op's reference (F.conv2d + the GroupNorm reference)
    # runs, which autograd differentiates; the output is the option-off path's.
    encoder = _encoder()
    images = torch.rand(1, 3, 16, 16)
    fused = FusedVQGANEncoder(encoder, conv_in_stats=True)
    out = fused(images)
    assert kernels.chosen_impl("conv_in_norm", "cpu", torch.float32, True) == "reference"
    out.sum().backward()
    norm1 = encoder.down[0].block[0].norm1  # conv_in's weight is a derived buffer; its bias and the norm are not
    for parameter in (encoder.conv_in.bias, norm1.weight, norm1.bias):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(out, encoder(images), rtol=1e-5, atol=1e-5)


def test_the_vqgan_takes_the_conv_in_stats_option():
    vqgan = VQGAN(CONFIG).eval()
    vqgan.use_fused(conv_in_stats=True)
    assert isinstance(vqgan.encoder, FusedVQGANEncoder) and vqgan.encoder.conv_in_stats
    vqgan.use_fused()
    assert not vqgan.encoder.conv_in_stats  # opt-in: off by default
    encoder = _encoder()
    encoder.down[0].block = torch.nn.ModuleList()
    with pytest.raises(ProCapError, match="conv_in_stats needs a residual block"):
        FusedVQGANEncoder(encoder, conv_in_stats=True)
