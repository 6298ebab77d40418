"""`procap.core.weights.meta_build`: a module's shapes without its initialisation (issue 50, item 3).

The checks a checkpoint meets before its weights are read (`check_file_fits`) and `procap info`'s parameter counts
build the model on the meta device. Run there, `nn.init` went through torch's Python references and imported
torch._dynamo (half a minute of a loaded machine); skipped, the module must come out exactly as before.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from procap.core.config import PRESETS, get_preset
from procap.core.weights import check_file_fits, meta_build, save_module
from procap.model.procap import ProCap, count_parameters
from procap.model.vqgan import VQGAN
from tests.support import small_vqgan_config


def _layout(module: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype, bool]]:
    """Every parameter and buffer: name, shape, dtype, and whether it is a parameter needing gradients."""
    params = {name: p.requires_grad for name, p in module.named_parameters()}
    return [(name, tuple(t.shape), t.dtype, params.get(name, False)) for name, t in module.state_dict().items()]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_meta_build_equals_the_initialised_one(preset):
    config = get_preset(preset)
    with torch.device("meta"):  # the build as it was: every init function run on the meta device
        reference = ProCap(config)
    with meta_build():
        built = ProCap(config)
    assert _layout(built) == _layout(reference)
    assert count_parameters(built) == count_parameters(reference)
    assert all(t.is_meta for t in built.state_dict().values())  # nothing allocated


def test_a_meta_build_leaves_the_random_state_and_real_tensors_alone():
    torch.manual_seed(5)
    with torch.device("meta"):
        VQGAN(small_vqgan_config())
    reference = torch.random.get_rng_state()
    torch.manual_seed(5)
    with meta_build():
        VQGAN(small_vqgan_config())
    assert torch.equal(torch.random.get_rng_state(), reference)
    torch.manual_seed(5)
    with meta_build():
        real = nn.init.normal_(torch.zeros(64, device="cpu"))  # a tensor given a device is initialised as asked
    torch.manual_seed(5)
    assert torch.equal(real, nn.init.normal_(torch.zeros(64)))  # the same draw as outside: only meta fills are skipped


class Filled(nn.Module):
    """Initialised in each of the ways a fill reaches a tensor."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.empty(3, 4))
        self.b = nn.Parameter(torch.empty(5, 1))
        nn.init.trunc_normal_(self.a, std=0.02)  # no torch-function override of its own: Tensor methods inside
        nn.init.kaiming_uniform_(tensor=self.b)  # the tensor given by keyword
        self.b.data.normal_(0, 1)  # a Tensor method called directly


class RandomOps(TorchDispatchMode):
    """Counts the random in-place ops that reach a kernel (on the meta device, torch's Python references)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("normal_", "uniform_", "normal", "uniform"):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def test_a_meta_build_skips_every_kind_of_initialisation():
    with RandomOps() as plain, torch.device("meta"):
        Filled()
    assert len(plain.names) >= 2  # the check below can fail: without meta_build the fills reach a kernel
    with RandomOps() as skipped, meta_build():
        module = Filled()
    assert skipped.names == []
    assert [tuple(p.shape) for p in module.parameters()] == [(3, 4), (5, 1)]


def test_check_file_fits_still_refuses_a_file_of_another_model(tmp_path):
    path = save_module(tmp_path / "vqgan.safetensors", VQGAN(small_vqgan_config()), {})
    check_file_fits(path, lambda: VQGAN(small_vqgan_config()), "VQGAN weights")
    with pytest.raises(Exception, match="shape|missing|unexpected"):
        check_file_fits(path, lambda: VQGAN(small_vqgan_config(n_embed=48)), "VQGAN weights")
