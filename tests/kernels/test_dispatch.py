"""The dispatch point (choice, override, fallback) and the compiled ops' registrations."""

from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

from procap import kernels
from procap.core.config import MaskingConfig
from procap.kernels import _ext
from procap.model.masking import sample_mask_params
from tests.support import impl_params

requires_ext = pytest.mark.skipif(
    _ext.load_error() is not None, reason=f"compiled ops not loaded ({_ext.load_error()})"
)


pytestmark = pytest.mark.usefixtures("fresh_dispatch")


def _masking_args(dtype=torch.float32, batch=2, frames=2, grid_h=2, grid_w=3, dim=8):
    params = sample_mask_params(batch, frames, grid_h, grid_w, MaskingConfig())
    x = torch.randn(batch, frames * grid_h * grid_w, dim, dtype=dtype)
    return x, params, torch.randn(dim), torch.randn(frames, dim), torch.randn(grid_h, dim), torch.randn(grid_w, dim)


def test_cpu_choice():
    expected = "cpp" if _ext.load() else "reference"
    assert kernels.chosen_impl("masking", "cpu", torch.bfloat16, True) == expected
    assert kernels.chosen_impl("vq_nearest", "cpu", torch.float32) == expected


def test_env_forces_reference(monkeypatch):
    monkeypatch.setenv("PROCAP_KERNELS", "reference")
    kernels.reset_dispatch()
    assert kernels.chosen_impl("masking", "cpu", torch.float32) == "reference"
    assert kernels.chosen_impl("vq_nearest", "cuda", torch.float16) == "reference"


def test_a_misspelt_env_value_warns_once_naming_the_valid_ones(monkeypatch):
    """A misspelt PROCAP_KERNELS (refrence) warns once, naming the valid values."""
    monkeypatch.setenv("PROCAP_KERNELS", "refrence")
    kernels.reset_dispatch()
    with pytest.warns(RuntimeWarning, match="PROCAP_KERNELS='refrence' is not one of reference, triton, cpp, cuda"):
        kernels.chosen_impl("masking", "cpu", torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernels.chosen_impl("vq_nearest", "cpu", torch.float32)  # once per value, not once per op
    assert not [w for w in caught if "PROCAP_KERNELS" in str(w.message)]


def test_bad_or_impossible_impl_raises():
    z, codebook = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="impl must be one of"):
        kernels.vq_nearest(z, codebook, impl="fast")
    with pytest.raises(ValueError, match="cuda tensors"):
        kernels.vq_nearest(z, codebook, impl="cuda")


def test_fallback_warns_once():
    # fp64 has no fused kernel: reference, with a single warning however often it is called.
    args = _masking_args(dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            kernels.masking(*args)
    fallbacks = [w for w in caught if "falling back" in str(w.message)]
    assert len(fallbacks) == 1
    assert kernels.chosen_impl("masking", "cpu", torch.float64, False) == "reference"


def test_submodules_do_not_shadow_the_dispatch_functions():
    # Importing procap.kernels.<name> sets an attribute <name> on the package; none may be a dispatch function.
    import procap.kernels._ext
    import procap.kernels.dispatch
    import procap.kernels.masking
    import procap.kernels.vq  # noqa: F401

    assert isinstance(kernels.masking, types.FunctionType) and isinstance(kernels.vq_nearest, types.FunctionType)


def test_ops_that_cannot_be_compiled_fall_back_with_one_sentence(tmp_path):
    """No compiler (an empty cache, CXX naming nothing): the references run, and one sentence says why, for all ops.

    Not a warning per op: the dispatch leaves that reason to procap.kernels._ext, which logs it once; a reason of
    another kind (fp64, below) still warns per op.
    """
    code = (
        "import warnings, torch\n"
        "from procap import kernels\n"
        "from procap.model.masking import sample_mask_params\n"
        "from procap.core.config import MaskingConfig\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2): idx = kernels.vq_nearest(torch.randn(5, 3), torch.randn(4, 3))\n"
        "    params = sample_mask_params(1, 2, 2, 2, MaskingConfig())\n"
        "    kernels.masking(torch.randn(1, 8, 4), params, torch.randn(4), *torch.randn(3, 2, 4).unbind(0))\n"
        "    kernels.vq_nearest(torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64))\n"
        "print(kernels.chosen_impl('vq_nearest', 'cpu', torch.float32), kernels.chosen_impl('masking', 'cpu', "
        "torch.float32), sum('falling back' in str(m.message) for m in w))\n"
    )
    env = os.environ | {"CXX": "/nonexistent/c++", "PROCAP_CACHE": str(tmp_path)}
    env.pop("PROCAP_SKIP_EXT", None)
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["reference", "reference", "1"]  # the one per-op warning: fp64's dtype
    said = [line for line in out.stderr.splitlines() if "compiled ops are not used" in line]
    expected = (
        "procap's compiled ops are not used: no C++ compiler ('/nonexistent/c++' is not found; install one or set "
        "CXX); procap.kernels runs Triton on CUDA where installed and the PyTorch references elsewhere "
        "(PROCAP_SKIP_EXT=1 skips this attempt)."
    )
    assert said == [expected], out.stderr


@requires_ext
def test_opcheck_masking():
    x, params, em, pf, pr, pc = _masking_args()
    for t in (x, em, pf, pr, pc):
        t.requires_grad_(True)
    args = (x, params.scheme, params.patch_prob, params.uniform, params.block, em, pf, pr, pc)
    torch.library.opcheck(
        torch.ops.procap.masking_fwd.default,
        args,
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )
    mask = torch.rand(2, 12) < 0.5
    torch.library.opcheck(
        torch.ops.procap.masking_bwd.default,
        (torch.randn(2, 12, 8), mask, 2, 2, 3, True),
        test_utils=("test_schema", "test_faketensor"),
    )


@requires_ext
def test_opcheck_vq_and_meta_shapes():
    torch.library.opcheck(
        torch.ops.procap.vq_nearest.default,
        (torch.randn(9, 5), torch.randn(7, 5)),
        test_utils=("test_schema", "test_faketensor"),
    )
    out = torch.ops.procap.vq_nearest(torch.empty(11, 5, device="meta"), torch.empty(7, 5, device="meta"))
    assert out.shape == (11,) and out.dtype == torch.int64


@pytest.mark.parametrize("impl", impl_params("vq_nearest"))
def test_every_impl_is_reachable(impl):
    # Sanity for the parametrisation itself: a runnable impl really runs (cpu inputs unless it needs CUDA).
    device = "cuda" if impl == "cuda" or (impl == "triton" and torch.cuda.is_available()) else "cpu"
    assert kernels.vq_nearest(torch.randn(3, 4, device=device), torch.randn(5, 4, device=device), impl=impl).shape == (
        3,
    )
