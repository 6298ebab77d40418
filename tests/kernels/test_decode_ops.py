"""The decoding step's fused ops against their references: residual add + LayerNorm, and the greedy step's tail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from procap import kernels
from procap.kernels import greedy
from procap.kernels.greedy import greedy_step_ref
from procap.kernels.layernorm import add_layer_norm_ref
from procap.model import decoder
from tests.support import DTYPES, impl_device, max_abs_err

pytestmark = pytest.mark.usefixtures("fresh_dispatch")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 96), (2, 5, 512)], ids=str)
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["same", "fp32"])
def test_add_layer_norm_matches_reference(dtype, shape, out_dtype):
    device = impl_device("triton")
    x = (torch.randn(shape, device=device) * 2 + 3).to(dtype)
    h = torch.randn(shape, device=device).to(dtype)
    weight, bias = torch.randn(shape[-1], device=device).to(dtype), torch.randn(shape[-1], device=device).to(dtype)
    x_got, x_ref = x.clone(), x.clone()
    got = kernels.add_layer_norm(x_got, h, weight, bias, 1e-5, out_dtype, impl="triton")
    ref = add_layer_norm_ref(x_ref, h, weight, bias, 1e-5, out_dtype)
    assert torch.equal(x_got, x_ref)  # the residual stream: one add, rounded like the eager one
    assert got.dtype == ref.dtype == (out_dtype or dtype) and got.shape == x.shape
    truth = F.layer_norm(x.double() + h.double(), shape[-1:], weight.double(), bias.double(), 1e-5)
    assert max_abs_err(got, truth) <= 2 * max_abs_err(ref, truth) + 1e-5
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def _greedy_inputs(dtype, vocab, device):
    torch.manual_seed(vocab)
    batch, dim, steps, keys = 21, 40, 7, 16
    logits = torch.randn(batch, vocab, device=device)
    logits[:, list(decoder.SUPPRESSED_IDS)] = float("-inf")
    logits[0, decoder.EOS_ID] = 50.0  # row 0 ends here
    logits[1, vocab - 1] = logits[1, 9] = 60.0  # a tie across vocabulary chunks: the first index wins
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    finished[2:5] = True
    return {
        "logits": logits,
        "finished": finished,
        "tokens": torch.zeros(batch, dtype=torch.long, device=device),
        "out": torch.full((batch, steps), 3, dtype=torch.long, device=device),
        "pos": torch.tensor([4], device=device),
        "x": torch.zeros(batch, dim, device=device).to(dtype),
        "mask": torch.full((keys,), float("-inf"), device=device).to(dtype),
        "embed": torch.randn(vocab, dim, device=device).to(dtype),
        "pos_embed": torch.randn(steps + 1, dim, device=device).to(dtype),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("vocab", [80, 1500], ids=lambda v: f"V{v}")
def test_greedy_step_matches_reference(dtype, vocab):
    device = impl_device("triton")
    got, ref = _greedy_inputs(dtype, vocab, device), _greedy_inputs(dtype, vocab, device)
    kernels.greedy_step(*got.values(), impl="triton")
    greedy_step_ref(*ref.values())
    for name in got:
        assert torch.equal(got[name], ref[name]), name
    assert got["pos"].item() == 5 and got["tokens"][0] == decoder.EOS_ID and got["finished"][0]
    assert got["tokens"][1] == 9 and (got["tokens"][2:5] == decoder.PAD_ID).all()
    assert (got["out"][:, 4] == got["tokens"]).all() and got["mask"][5] == 0 and got["mask"][6] == float("-inf")


def test_the_kernel_ids_are_the_models():
    assert (greedy.PAD_ID, greedy.EOS_ID) == (decoder.PAD_ID, decoder.EOS_ID)
