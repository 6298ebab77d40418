"""Every attention backend against the fp32 ``math`` reference: shapes, causal with Lq != Lk, bool and additive
masks, dtypes."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from procap.kernels import attention as attn_mod
from procap.kernels.attention import (
    BACKENDS,
    SAFE_ORDER,
    USES,
    BackendUnavailableError,
    attention,
    attention_math,
    auto_order,
    available_backends,
    backend_for_mask,
    resolve_backend,
    select_backend,
    unavailable_reason,
    use_backend,
)
from tests.support import requires_cuda

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=requires_cuda),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (B, H, Lq, Lk, Dh): odd lengths, a single decoding query, Lq > Lk would be meaningless with causal.
SHAPES = [(2, 3, 7, 7, 16), (1, 2, 1, 13, 32), (2, 2, 5, 33, 64), (1, 1, 97, 123, 8)]


def _plain_low_precision(q, k, v, causal, mask):
    """The same math in q's dtype end to end: the error budget a low-precision backend is allowed (x2)."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril(k.shape[-2] - q.shape[-2])
    if mask is not None:
        allowed = allowed & mask
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _inputs(shape, dtype, device, with_mask):
    b, h, lq, lk, dh = shape
    q, k, v = (torch.randn(b, h, n, dh, device=device) for n in (lq, lk, lk))
    mask = None
    if with_mask:
        mask = torch.rand(b, 1, lq, lk, device=device) > 0.3
        # Every query keeps the last key the causal cut leaves it (key i + Lk - Lq): no all -inf rows.
        rows = torch.arange(lq, device=device)
        mask[..., rows, (rows + lk - lq).clamp(min=0)] = True
    return q, k, v, mask, tuple(t.to(dtype) for t in (q, k, v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "auto"])
@pytest.mark.parametrize("causal,with_mask", [(False, False), (True, False), (False, True), (True, True)])
def test_backend_matches_math(backend, dtype, device, causal, with_mask):
    reason = unavailable_reason(backend, device, dtype)
    if reason:
        pytest.skip(f"{backend} on {device}/{dtype}: {reason}")
    if backend == "flash" and with_mask:
        pytest.skip("flash-attn takes no attn_mask (checked in test_flash_rejects_mask)")
    if backend == "sdpa_flash" and with_mask and device == "cuda":
        q = torch.randn(1, 1, 4, 16, device=device, dtype=dtype)
        with pytest.raises(BackendUnavailableError, match="attn_mask"):
            attention(
                q, q, q, causal=causal, attn_mask=torch.ones(4, 4, dtype=torch.bool, device=device), backend=backend
            )
        return
    for shape in SHAPES:
        if causal and shape[2] > shape[3]:
            continue
        q, k, v, mask, low = _inputs(shape, dtype, device, with_mask)
        ref = attention_math(q, k, v, causal, mask)
        out = attention(*low, causal=causal, attn_mask=mask, backend=backend)
        assert out.dtype == dtype and out.shape == ref.shape
        err = (out.float() - ref).abs().max().item()
        if dtype == torch.float32:
            assert err < 2e-5, f"{backend} {shape}: max error {err}"
        else:
            budget = (_plain_low_precision(*low, causal, mask).float() - ref).abs().max().item()
            assert err <= 2 * budget + 1e-3, f"{backend} {shape}: error {err} vs plain {dtype} {budget}"


def test_math_causal_is_bottom_right_aligned():
    q, k, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    out = attention_math(q, k, v, causal=True)
    # The last query sees every key; the first sees keys 0..2.
    full = attention_math(q[..., -1:, :], k, v)
    prefix = attention_math(q[..., :1, :], k[..., :3, :], v[..., :3, :])
    torch.testing.assert_close(out[..., -1:, :], full)
    torch.testing.assert_close(out[..., :1, :], prefix)


def test_mask_blocks_keys():
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    mask[..., :2] = True
    for backend in ("math", "sdpa"):
        torch.testing.assert_close(
            attention(q, k, v, attn_mask=mask, backend=backend), attention_math(q, k[..., :2, :], v[..., :2, :])
        )


def test_auto_is_cached_and_available():
    choice = select_backend("cpu", torch.float32)
    assert choice in available_backends("cpu", torch.float32)
    assert attn_mod._auto_cache[("cpu", torch.float32, "encoder")] == choice
    assert select_backend(torch.device("cpu"), torch.float32) == choice


def test_use_backend_scope_overrides_auto():
    with use_backend("math"):
        assert select_backend("cpu", torch.float32) == "math"
    assert select_backend("cpu", torch.float32) != "math" or "sdpa" not in available_backends("cpu", torch.float32)


def test_unavailable_backend_raises_clear_error():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(BackendUnavailableError, match=r"'flash'.*pip install flash-attn"):
        attention(q, q, q, backend="flash")  # flash-attn never runs on CPU tensors
    with pytest.raises(BackendUnavailableError, match=r"'xformers'.*xformers"):
        attention(q, q, q, backend="xformers")


def test_unknown_backend_raises():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, q, q, backend="fastest")


@requires_cuda
def test_flash_rejects_mask():
    if unavailable_reason("flash", "cuda", torch.bfloat16):
        pytest.skip("flash-attn is not installed or not supported on this GPU")
    q = torch.randn(1, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailableError, match="attn_mask"):
        attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool, device="cuda"), backend="flash")


def test_environment_variable_overrides_auto(monkeypatch):
    monkeypatch.setenv("PROCAP_ATTENTION", "math")
    assert select_backend("cpu", torch.float32) == "math"
    monkeypatch.setenv("PROCAP_ATTENTION", "flash")
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(BackendUnavailableError, match="flash"):
        attention(q, q, q)  # a forced backend is checked like an explicit one


def test_flash_attn_4_alone_does_not_count_as_flash(tmp_path, monkeypatch):
    # flash-attn 4 installs only the namespace package flash_attn.cute: find_spec("flash_attn") succeeds, which made
    # `auto` pick "flash" and every call fail. The backend must ask for flash-attn 2's flash_attn_func.
    import importlib.util
    import sys

    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert importlib.util.find_spec("flash_attn") is not None  # what the old check relied on
        reason = attn_mod._import_reason("flash")
        assert reason is not None and "flash_attn_func" in reason
    finally:
        for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
            del sys.modules[name]


def test_a_layer_set_to_flash_runs_masked_calls_on_sdpa():
    """backend_for_mask: flash takes no mask, so masked calls of a flash layer run on sdpa; nothing else changes."""
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    assert backend_for_mask("flash", mask) == "sdpa"
    assert backend_for_mask("flash", None) == "flash"
    assert all(backend_for_mask(name, mask) == name for name in BACKENDS if name != "flash")


SDPA_PINS = {"sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH", "sdpa_flash": "FLASH_ATTENTION"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", available_backends("cpu", torch.float32))
def test_an_additive_mask_is_the_bool_mask(backend, dtype):
    """The cached decoding step's mask is a 0 / -inf bias over its key slots, one row for every query (B, H, 1, K);
    each backend gives with it exactly what it gives with the bool mask, and an SDPA backend exactly what SDPA gives
    when called directly with the bias (how the step called it before it went through ``attention``)."""
    if unavailable_reason(backend, "cpu", dtype) is not None:
        pytest.skip(unavailable_reason(backend, "cpu", dtype))
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 4, n, 16, generator=generator).to(dtype) for n in (1, 32, 32))
    bias = torch.full((32,), float("-inf"), dtype=dtype)
    bias[:7] = 0.0  # the keys decoded so far; the slots after them hold stale values
    bias = bias.view(1, 1, 1, 32)
    got = attention(q, k, v, attn_mask=bias, backend=backend)
    assert torch.equal(got, attention(q, k, v, attn_mask=bias == 0, backend=backend))
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, attention_math(q, k[..., :7, :], v[..., :7, :]), **tolerance)
    if backend.startswith("sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        pin = (
            sdpa_kernel([getattr(SDPBackend, SDPA_PINS[backend])]) if backend in SDPA_PINS else contextlib.nullcontext()
        )
        with pin:
            assert torch.equal(got, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_folds_into_an_additive_mask(backend):
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    visible = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    visible[..., 1] = False
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    expected = attention(q, k, v, causal=True, attn_mask=visible, backend=backend)
    assert torch.equal(attention(q, k, v, causal=True, attn_mask=bias, backend=backend), expected)


def test_resolve_backend_is_what_auto_runs():
    assert resolve_backend("auto", "cpu", torch.float32) == select_backend("cpu", torch.float32)
    assert resolve_backend("math", "cpu", torch.float32) == "math"
    with use_backend("math"):
        assert resolve_backend("auto", "cpu", torch.float32) == "math"


# -- auto's order: measured per (architecture, use), else the backends that have run --------------------------------


@pytest.fixture
def measured(monkeypatch):
    """An empty MEASURED_ORDER and a fresh ``auto`` cache for the test to fill, both put back after it."""
    monkeypatch.setattr(attn_mod, "MEASURED_ORDER", {})
    monkeypatch.setattr(attn_mod, "_auto_cache", {})
    monkeypatch.delenv("PROCAP_ATTENTION", raising=False)
    return attn_mod.MEASURED_ORDER


def test_unmeasured_architectures_take_the_safe_order(measured):
    # flash-attn has never run anywhere: nothing unmeasured puts it (or xformers) first any more.
    measured[("sm90", "encoder")] = ("flash", "sdpa_cudnn")
    for arch, use in (("sm75", "encoder"), ("sm100", "decode"), ("sm90", "decode"), ("cpu", "encoder")):
        assert auto_order(arch, use) == SAFE_ORDER
    assert SAFE_ORDER[0] == "sdpa" and "flash" not in SAFE_ORDER and "xformers" not in SAFE_ORDER
    assert auto_order("sm90", "encoder") == ("flash", "sdpa_cudnn", *SAFE_ORDER)  # then the safe ones, once each
    with pytest.raises(ValueError, match="unknown attention use"):
        auto_order("sm90", "training")


def test_the_committed_measured_order_names_real_backends():
    for (arch, use), order in attn_mod.MEASURED_ORDER.items():
        assert arch.startswith("sm") and use in USES and order and set(order) <= set(BACKENDS) - {"auto"}


def test_a_measured_order_changes_the_choice_of_its_architecture_and_use(measured):
    assert select_backend("cpu", torch.float32) == "sdpa"
    measured[("cpu", "encoder")] = ("xformers", "math")  # xformers cannot run on a CPU: the next one is taken
    attn_mod._auto_cache.clear()
    assert select_backend("cpu", torch.float32) == "math"
    assert select_backend("cpu", torch.float32, "decode") == "sdpa"  # the other use keeps the safe order
    assert resolve_backend("auto", "cpu", torch.float32, use="decode") == "sdpa"


def test_one_query_row_resolves_auto_for_the_decode_use(measured, monkeypatch):
    measured[("cpu", "decode")] = ("math",)
    ran = []
    real = attn_mod._run_backend
    monkeypatch.setattr(attn_mod, "_run_backend", lambda backend, *args: ran.append(backend) or real(backend, *args))
    q, k = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 5, 8)
    attention(q, k, k)
    attention(k, k, k)
    assert ran == ["math", "sdpa"]
