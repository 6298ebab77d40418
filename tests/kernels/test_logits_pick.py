"""The decoding step's logits GEMV + greedy pick (``procap.kernels.logits_pick``) against its reference: the fp32
GEMM and the greedy step's reference, which is the step's path without it."""

from __future__ import annotations

import pytest
import torch

from procap import kernels
from procap.kernels import logits_pick
from procap.kernels.logits_pick import greedy_logits_step_ref, logits_tiles
from procap.model import decoder
from tests.support import DTYPES, impl_device

pytestmark = pytest.mark.usefixtures("fresh_dispatch")

BATCH, DIM, STEPS, KEYS = 5, 40, 7, 16


def _inputs(model_dtype, weight_dtype, vocab, device, integer):
    """The op's arguments. ``integer``: zeros and ones, so every dot product is exact in any summation order (equal
    logits in both implementations) and the row maxima tie often, within tiles and across them."""
    generator = torch.Generator().manual_seed(vocab)

    def draw(*shape):
        if integer:
            return torch.randint(0, 2, shape, generator=generator).float()
        return torch.randn(*shape, generator=generator)

    hidden, weight = draw(BATCH, DIM), draw(vocab, DIM)
    if integer:  # row b counts the ones among four dimensions of its own: a logit of 0..4, the maximum often tied
        hidden = torch.zeros(BATCH, DIM)
        for row in range(BATCH):
            hidden[row, 4 * row : 4 * row + 4] = 1.0
    bias = torch.zeros(vocab).index_fill_(0, torch.tensor(sorted(decoder.SUPPRESSED_IDS)), float("-inf"))
    if not integer:
        weight[vocab - 1] = weight[9]  # the same logit at 9 and at the last id (another tile): 9 must win
        hidden[0] = weight[decoder.EOS_ID] * 3  # row 0 ends here
    finished = torch.zeros(BATCH, dtype=torch.bool)
    finished[2] = True
    tiles = logits_tiles(vocab)
    args = {
        "hidden": hidden,
        "weight": weight.to(weight_dtype),
        "bias": bias,
        "logits": torch.zeros(BATCH, vocab),
        "tile_max": torch.zeros(BATCH, tiles),
        "tile_index": torch.zeros(BATCH, tiles, dtype=torch.long),
        "finished": finished,
        "tokens": torch.zeros(BATCH, dtype=torch.long),
        "out": torch.full((BATCH, STEPS), 3, dtype=torch.long),
        "pos": torch.tensor([4]),
        "x": torch.zeros(BATCH, DIM).to(model_dtype),
        "mask": torch.full((KEYS,), float("-inf")).to(model_dtype),
        "embed": draw(vocab, DIM).to(model_dtype),
        "pos_embed": draw(STEPS + 1, DIM).to(model_dtype),
    }
    return {name: value.to(device) for name, value in args.items()}


def _run_both(model_dtype, weight_dtype, vocab, integer):
    device = impl_device("triton")
    got = _inputs(model_dtype, weight_dtype, vocab, device, integer)
    ref = _inputs(model_dtype, weight_dtype, vocab, device, integer)
    kernels.greedy_logits_step(*got.values(), impl="triton")
    greedy_logits_step_ref(*ref.values())
    return got, ref


# 80: the clevr vocabulary (3 tiles, the last partly filled); 33: one id past a tile; 12: less than one tile.
@pytest.mark.parametrize("vocab", [80, 33, 12], ids=lambda v: f"V{v}")
@pytest.mark.parametrize("model_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["w_fp32", "w_bf16"])
def test_tokens_and_logits_match_the_reference(model_dtype, weight_dtype, vocab):
    got, ref = _run_both(model_dtype, weight_dtype, vocab, integer=False)
    torch.testing.assert_close(got["logits"], ref["logits"], rtol=1e-5, atol=1e-5)  # the summation order differs
    assert torch.equal(torch.isinf(got["logits"]), torch.isinf(ref["logits"]))  # the suppressed ids stay -inf
    for name in ("tokens", "out", "finished", "pos", "x", "mask"):
        assert torch.equal(got[name], ref[name]), name
    assert got["tokens"][0] == decoder.EOS_ID and got["finished"][0] and got["tokens"][2] == decoder.PAD_ID
    assert got["pos"].item() == 5 and (got["out"][:, 4] == got["tokens"]).all()


@pytest.mark.parametrize("vocab", [80, 45], ids=lambda v: f"V{v}")
def test_ties_go_to_the_lowest_index_as_the_reference_breaks_them(vocab):
    got, ref = _run_both(torch.float32, torch.float32, vocab, integer=True)
    assert torch.equal(got["logits"], ref["logits"])  # integers: exact in any order
    finite = torch.where(torch.isinf(ref["logits"]), float("-inf"), ref["logits"])
    tied = (finite == finite.max(dim=1, keepdim=True).values).sum(dim=1)
    assert (tied > 1).sum() >= 3  # most rows tie: the check below is about ties
    assert torch.equal(got["tokens"], ref["tokens"])
    winners = finite.argmax(dim=1)  # torch.argmax: the first maximum
    winners[2] = decoder.PAD_ID  # finished before the step
    assert torch.equal(got["tokens"], winners)


def test_the_tile_maxima_and_their_first_indices_are_written():
    got, ref = _run_both(torch.float32, torch.float32, 45, integer=True)  # tiles of 32: ids 0-31 and 32-44
    logits = ref["logits"]
    for tile in range(logits_tiles(45)):
        part = logits[:, tile * logits_pick.TILE_ROWS : (tile + 1) * logits_pick.TILE_ROWS]
        assert torch.equal(got["tile_max"][:, tile], part.max(dim=1).values)
        assert torch.equal(got["tile_index"][:, tile], part.argmax(dim=1) + tile * logits_pick.TILE_ROWS)


def test_mismatched_workspaces_are_refused():
    args = _inputs(torch.float32, torch.float32, 40, impl_device("triton"), integer=True)
    args["tile_index"] = args["tile_index"][:, :1].contiguous()
    with pytest.raises(ValueError, match="tile_max and tile_index"):
        logits_pick.greedy_logits_step_triton(*args.values())


def test_the_dispatch_picks_triton_on_cuda_and_the_reference_for_gradients():
    assert kernels.chosen_impl("greedy_logits_step", "cuda", torch.float32) == "triton"
    with pytest.warns(RuntimeWarning, match="no fused backward"):
        assert kernels.chosen_impl("greedy_logits_step", "cuda", torch.float32, requires_grad=True) == "reference"
