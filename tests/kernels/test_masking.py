"""Every masking implementation against ``masking_ref``: outputs, masks, gradients, geometry, statistics."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procap import kernels
from procap.core.config import MaskingConfig
from procap.kernels.masking import ENTIRE, IN_BLOCK, OUT_OF_BLOCK, RANDOM_PATCH, MaskParams, masking_ref
from procap.model.masking import sample_mask_params
from tests.support import DTYPES, impl_device, impl_params, max_abs_err

IMPLS = impl_params("masking_fwd", cuda_kernel=False)  # CUDA runs the Triton kernel; kernels/csrc/cuda has none
# (B, T, H, W, D): odd sizes so rows and D are never multiples of the kernels' blocks.
SHAPES = [(4, 2, 3, 5, 97), (3, 4, 2, 2, 16), (2, 1, 2, 3, 300), (1, 1, 1, 1, 1)]


def _inputs(batch, frames, grid_h, grid_w, dim, dtype, device, requires_grad=False):
    """x, params covering every scheme (sample b uses scheme b % 4), e_m and the three fp32 tables."""
    params = sample_mask_params(batch, frames, grid_h, grid_w, MaskingConfig(), device=device)
    params.scheme = torch.arange(batch, device=device) % 4
    x = torch.randn(batch, frames * grid_h * grid_w, dim, device=device).to(dtype)
    tables = [torch.randn(n, dim, device=device) for n in (frames, grid_h, grid_w)]
    mask_embedding = torch.randn(dim, device=device)
    leaves = [x, mask_embedding, *tables]
    for t in leaves:
        t.requires_grad_(requires_grad)
    return x, params, mask_embedding, tables


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_is_bit_identical(impl, dtype, shape):
    # Same draws, same comparisons, same fp32 additions in the same order: the output must match exactly.
    x, params, em, tables = _inputs(*shape, dtype, impl_device(impl))
    out, mask = kernels.masking(x, params, em, *tables, impl=impl)
    ref_out, ref_mask = masking_ref(x, params, em, *tables)
    assert out.dtype == dtype and mask.dtype == torch.bool
    assert torch.equal(mask, ref_mask)
    assert torch.equal(out, ref_out)


def _exact_grads(x, params, g, tables):
    """fp64 ground truth: grad_x = g * ~mask, e_m gets the masked sum, each table the sum over the other axes."""
    frames, grid_h, grid_w = (t.shape[0] for t in tables)
    mask = masking_ref(x.detach(), params, torch.zeros(x.shape[-1], device=x.device), *[t.detach() for t in tables])[1]
    g64 = g.double()
    grid = g64.sum(0).view(frames, grid_h, grid_w, -1)
    return [
        g64 * ~mask[..., None],
        (g64 * mask[..., None]).sum((0, 1)),
        grid.sum((1, 2)),
        grid.sum((0, 2)),
        grid.sum((0, 1)),
    ]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_reference(impl, dtype):
    x, params, em, tables = _inputs(5, 2, 3, 5, 97, dtype, impl_device(impl), requires_grad=True)
    leaves = [x, em, *tables]
    out, _ = kernels.masking(x, params, em, *tables, impl=impl)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    ref_grads = torch.autograd.grad(masking_ref(x, params, em, *tables)[0], leaves, g)
    truth = _exact_grads(x, params, g, tables)
    assert torch.equal(grads[0], ref_grads[0])  # g * ~mask involves no rounding
    for name, got, ref, exact in zip(["e_m", "frame", "row", "col"], grads[1:], ref_grads[1:], truth[1:]):
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        # fp32 sums in another order: at most ~2x the reference's own error against the fp64 truth.
        assert max_abs_err(got, exact) <= 2 * max_abs_err(ref, exact) + 1e-5, name


@pytest.mark.parametrize("impl", IMPLS)
def test_only_table_gradients(impl):
    # x not requiring grad: the kernels skip grad_x but still produce the parameter gradients.
    x, params, em, tables = _inputs(2, 2, 2, 3, 33, torch.float32, impl_device(impl))
    em.requires_grad_(True)
    out, _ = kernels.masking(x, params, em, *tables, impl=impl)
    (grad_em,) = torch.autograd.grad(out.sum(), [em])
    (ref_em,) = torch.autograd.grad(masking_ref(x, params, em, *tables)[0].sum(), [em])
    torch.testing.assert_close(grad_em, ref_em, rtol=1e-5, atol=1e-5)


@st.composite
def _geometry(draw):
    batch, frames = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    grid_h, grid_w, dim = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 40))
    # Arbitrary rectangles, including empty ones and ones reaching past the grid: the kernels must still agree.
    block = [
        [
            draw(st.integers(-1, grid_h)),
            draw(st.integers(-1, grid_w)),
            draw(st.integers(0, grid_h + 1)),
            draw(st.integers(0, grid_w + 1)),
        ]
        for _ in range(batch)
    ]
    scheme = [draw(st.integers(0, 3)) for _ in range(batch)]
    return batch, frames, grid_h, grid_w, dim, block, scheme


def _check_geometry(impl, geometry, seed):
    batch, frames, grid_h, grid_w, dim, block, scheme = geometry
    gen = torch.Generator().manual_seed(seed)
    n_pos = frames * grid_h * grid_w
    params = MaskParams(
        scheme=torch.tensor(scheme),
        patch_prob=torch.rand(batch, generator=gen),
        uniform=torch.rand(batch, n_pos, generator=gen),
        block=torch.tensor(block),
    )
    device = impl_device(impl)
    params = params.to(device)
    x = torch.randn(batch, n_pos, dim, generator=gen).to(device)
    tables = [torch.randn(n, dim, generator=gen).to(device) for n in (frames, grid_h, grid_w)]
    em = torch.randn(dim, generator=gen).to(device)
    out, mask = kernels.masking(x, params, em, *tables, impl=impl)
    ref_out, ref_mask = masking_ref(x, params, em, *tables)
    assert torch.equal(mask, ref_mask) and torch.equal(out, ref_out)


@pytest.mark.parametrize("impl", [p for p in IMPLS if p.values[0] != "reference"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geometry=_geometry(), seed=st.integers(0, 2**16))
def test_random_geometry(impl, geometry, seed):
    _check_geometry(impl, geometry, seed)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_statistics(impl):
    # Large batch of the configured distribution: scheme frequencies, random-patch rates and block areas.
    config = MaskingConfig(scheme_probs=(0.1, 0.5, 0.2, 0.2), patch_prob_range=(0.2, 0.5))
    batch, frames, grid_h, grid_w = 1000, 2, 4, 4
    device = impl_device(impl)
    params = sample_mask_params(batch, frames, grid_h, grid_w, config, device=device)
    x = torch.zeros(batch, frames * grid_h * grid_w, 1, device=device)
    zeros = [torch.zeros(n, 1, device=device) for n in (frames, grid_h, grid_w)]
    _, mask = kernels.masking(x, params, torch.zeros(1, device=device), *zeros, impl=impl)
    mask, scheme, prob = mask.cpu(), params.scheme.cpu(), params.patch_prob.cpu()
    expected = torch.tensor(config.scheme_probs, dtype=torch.float64)
    freq = torch.bincount(scheme, minlength=4).double() / batch
    # 5 standard deviations throughout: fails on a wrong mapping of schemes or rates, not by chance.
    assert torch.all((freq - expected).abs() <= 5 * torch.sqrt(expected * (1 - expected) / batch))
    fraction = mask.double().mean(1)
    assert torch.all(fraction[scheme == ENTIRE] == 1.0)
    patch = scheme == RANDOM_PATCH
    # Each random-patch sample masks a Binomial(N, p_b) share: the mean of (fraction - p_b) is ~0.
    n_pos, n_patch = mask.shape[1], int(patch.sum())
    sigma = torch.sqrt((prob[patch] * (1 - prob[patch])).mean() / n_pos / n_patch).item()
    assert abs((fraction[patch] - prob[patch]).mean().item()) <= 5 * sigma
    assert abs(fraction[patch].mean().item() - 0.35) <= 5 * (0.3 / 12**0.5 / n_patch**0.5 + sigma)
    inside = fraction[scheme == IN_BLOCK]
    assert inside.min() >= 1 / (grid_h * grid_w) and 0.15 < inside.mean() < 0.85
    outside = fraction[scheme == OUT_OF_BLOCK]
    assert 0.15 < outside.mean() < 0.85
    # The rectangle is shared by all frames.
    per_frame = mask.view(batch, frames, grid_h * grid_w)
    blocks = (scheme == IN_BLOCK) | (scheme == OUT_OF_BLOCK)
    assert torch.equal(per_frame[blocks, 0], per_frame[blocks, 1])


@pytest.mark.parametrize("impl", IMPLS)
def test_wrong_position_count_raises(impl):
    x, params, em, tables = _inputs(2, 2, 3, 5, 8, torch.float32, impl_device(impl))
    with pytest.raises(ValueError, match="positions"):
        kernels.masking(x[:, :-1], params, em, *tables, impl=impl)
