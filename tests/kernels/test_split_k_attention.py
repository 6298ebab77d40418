"""The split-K decode attention (``procap.kernels.split_k_attention``) against its reference, the fp32-softmax
``attention_math``: every dtype, the step's strided cache views, key counts off the split and the tile, batch 1."""

from __future__ import annotations

import pytest
import torch

from procap import kernels
from procap.kernels import split_k_attention
from procap.kernels.split_k_attention import MAX_SPLITS, decode_attention_ref, decode_attention_triton, split_plan
from tests.support import DTYPES, impl_device, requires_triton

pytestmark = [pytest.mark.usefixtures("fresh_dispatch"), requires_triton]


def _step_inputs(batch, heads, keys, head_dim, dtype, scale=1.0, seed=0):
    """q (B, H, 1, Dh) and k, v (B, H, Lk, Dh) as the decoding step holds them: views of its (B, D) query rows and
    of its (B, Lk, 2D) cross cache (strided, not contiguous)."""
    generator = torch.Generator().manual_seed(seed)
    dim = heads * head_dim
    cache = (torch.randn(batch, keys, 2 * dim, generator=generator) * scale).to(dtype)
    k, v = (cache[..., i * dim : (i + 1) * dim].view(batch, keys, heads, head_dim).transpose(1, 2) for i in range(2))
    q = (torch.randn(batch, dim, generator=generator) * scale).to(dtype).view(batch, heads, 1, head_dim)
    device = impl_device("triton")
    return q.to(device), k.to(device), v.to(device)


# (batch, heads, keys, head dim, keys per split, keys per tile):
SHAPES = [
    (1, 8, 130, 64, 64, 64),  # the clevr head dim at batch 1; the last of 3 default splits holds 2 keys
    (2, 4, 90, 32, 64, 64),  # the tiny preset's memory (90 keys) and head dim
    (3, 3, 37, 16, 16, 8),  # 3 splits, the last part-filled; two tiles a split: the in-split merge runs
    (1, 2, 1, 24, 16, 16),  # one key; a head dim that is no power of two
    (2, 1, 600, 8, 16, 8),  # 38 splits of 16 are over MAX_SPLITS: 19 of 32 keys, four tiles each
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_reference(shape, dtype):
    batch, heads, keys, head_dim, split_keys, block_keys = shape
    q, k, v = _step_inputs(batch, heads, keys, head_dim, dtype)
    assert keys == 1 or k.stride(2) == 2 * heads * head_dim  # the kernel reads the cache through its strides
    got = decode_attention_triton(q, k, v, split_keys=split_keys, block_keys=block_keys)
    ref = decode_attention_ref(q, k, v)
    assert got.shape == ref.shape == (batch, heads, 1, head_dim) and got.dtype == dtype
    if dtype == torch.float32:  # the summation order alone differs
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    else:  # both round one fp32 result: at most one unit in the last place apart
        torch.testing.assert_close(got, ref)


def test_large_scores_stay_finite():
    # Scores near 1e4 overflow exp without the running maximum; the splits' maxima differ by thousands, so a split
    # whose weights all underflow must still merge as zero.
    q, k, v = _step_inputs(2, 2, 100, 16, torch.float32, scale=25.0)
    got = decode_attention_triton(q, k, v, split_keys=16, block_keys=16)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, decode_attention_ref(q, k, v), rtol=1e-5, atol=1e-4)


def test_a_rows_result_does_not_depend_on_its_batch():
    # The split length depends on the key count alone: row 0 decoded alone and beside others is the same bits.
    q, k, v = _step_inputs(4, 2, 200, 32, torch.bfloat16)
    together = decode_attention_triton(q, k, v)
    alone = decode_attention_triton(q[:1], k[:1], v[:1])
    assert torch.equal(together[:1], alone)


def test_the_split_plan_keeps_the_combine_in_one_tile():
    assert split_plan(784) == (13, 64)  # the clevr memory at k = 2
    assert split_plan(90) == (2, 64)
    assert split_plan(1) == (1, 64)
    splits, keys_per_split = split_plan(100_000)
    assert splits <= MAX_SPLITS and splits * keys_per_split >= 100_000 and (splits - 1) * keys_per_split < 100_000


def test_keys_and_values_in_other_layouts():
    # contiguous keys beside strided values: walked with one set of strides after a copy, the same result
    q, k, v = _step_inputs(2, 2, 40, 16, torch.float16)
    got = decode_attention_triton(q, k.contiguous(), v, split_keys=16, block_keys=16)
    torch.testing.assert_close(got, decode_attention_ref(q, k, v))


def test_other_shapes_are_refused():
    q, k, v = _step_inputs(1, 2, 10, 16, torch.float32)
    with pytest.raises(ValueError, match=r"q \(B, H, 1, Dh\)"):
        decode_attention_triton(torch.cat([q, q], dim=2), k, v)
    with pytest.raises(ValueError, match="one dtype"):
        decode_attention_triton(q, k.half(), v.half())


def test_the_dispatch_runs_triton_on_cuda_and_the_reference_elsewhere():
    assert kernels.chosen_impl("decode_attention", "cuda", torch.bfloat16) == "triton"
    assert kernels.chosen_impl("decode_attention", "cpu", torch.float32) == "reference"
    with pytest.warns(RuntimeWarning, match="no fused backward"):
        assert kernels.chosen_impl("decode_attention", "cuda", torch.float32, requires_grad=True) == "reference"
    q, k, v = _step_inputs(1, 2, 10, 16, torch.float32)
    assert torch.equal(kernels.decode_attention(q, k, v, impl="reference"), decode_attention_ref(q, k, v))
    torch.testing.assert_close(kernels.decode_attention(q, k, v, impl="triton"), decode_attention_ref(q, k, v))
    assert split_k_attention.DECODE_ATTENTION.differentiable is False
