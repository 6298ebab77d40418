"""The lean decoding step against the model decoder's own ``decode_step``, and its ATen op count (the ceiling).

At decoding batch sizes each op of the step is a few microseconds of launch latency, so the number of ops is the
cost; the count test makes a regression fail on a CPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from procap import kernels
from procap.config import get_preset
from procap.fast.lean_decode import LeanDecoder, lean_decoding_supported
from procap.kernels import dispatch
from procap.model.decoder import CaptionDecoder

MAX_STEP_OPS = 30  # the clevr decoder (2 layers): 13 per layer, a LayerNorm, the logits GEMM and the pick


@pytest.fixture(autouse=True)
def _fresh_dispatch(monkeypatch):
    monkeypatch.delenv("PROCAP_KERNELS", raising=False)
    kernels.reset_dispatch()
    yield
    kernels.reset_dispatch()


def _decode_both(decoder: torch.nn.Module, memory: torch.Tensor, max_len: int):
    """Per step: (model logits, lean logits), and both token outputs at the end."""
    model_state = decoder.setup_caches(memory.shape[0], max_len, memory.dtype, memory.device)
    lean = LeanDecoder(decoder)
    lean_state = lean.setup_caches(memory.shape[0], max_len, memory.dtype, memory.device)
    decoder.prefill(memory, model_state)
    lean.prefill(memory, lean_state)
    logits = []
    for _ in range(model_state.steps):
        decoder.decode_step(model_state)
        lean.decode_step(lean_state)
        logits.append((model_state.logits.clone(), lean_state.logits.clone()))
    return logits, model_state.out, lean_state.out


# The interpreter runs each Triton program in Python: fewer rows and steps there.
@pytest.mark.parametrize("impl,rows,max_len", [("reference", 6, 16), ("triton", 3, 6)], ids=["reference", "triton"])
def test_fp32_logits_and_tokens_equal_the_model_step(trained, pairs, impl, rows, max_len, monkeypatch):
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(pairs[0][:rows], pairs[1][:rows])
    monkeypatch.setenv("PROCAP_KERNELS", impl)  # for the decoding ops only
    kernels.reset_dispatch()
    logits, model_out, lean_out = _decode_both(model.decoder, memory, max_len)
    assert torch.equal(lean_out, model_out)
    assert len(set(model_out.flatten().tolist())) > 2  # the trained fixture's tokens vary: a real comparison
    for ref, got in logits:
        finite = torch.isfinite(ref)
        assert torch.equal(finite, torch.isfinite(got))  # the same ids suppressed
        torch.testing.assert_close(got[finite], ref[finite], rtol=1e-5, atol=1e-5)


def test_bf16_triton_step_follows_the_model_step(trained, pairs, monkeypatch):
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(pairs[0][:2], pairs[1][:2])
    monkeypatch.setenv("PROCAP_KERNELS", "triton")
    kernels.reset_dispatch()
    decoder = CaptionDecoder(model.config)
    decoder.load_state_dict(model.decoder.state_dict())
    decoder.eval().to(torch.bfloat16)
    logits, _, _ = _decode_both(decoder, memory.to(torch.bfloat16), 2)
    ref, got = logits[0]  # the first step: the same input token, so only rounding differs
    finite = torch.isfinite(ref)
    assert (got[finite] - ref[finite]).abs().max() <= 0.05 * ref[finite].abs().max()


class _KernelCount(TorchDispatchMode):
    """Counts ATen ops that launch work (views excluded); a fused op counts once, however it runs here."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _count_step(step, monkeypatch) -> list[str]:
    counter = _KernelCount()
    real_run = dispatch.run

    def one_launch(name, impl, like, requires_grad, *args):
        counter.ops.append(f"fused:{name}")
        assert dispatch.chosen_impl(name, "cuda", like.dtype) == "triton"  # one kernel on a GPU
        with _disable_current_modes():  # what the reference (or the interpreter) does inside is not counted
            return real_run(name, impl, like, requires_grad, *args)

    monkeypatch.setattr(dispatch, "run", one_launch)
    for module in (kernels.layernorm, kernels.greedy):
        monkeypatch.setattr(module, "run", one_launch)
    with torch.no_grad(), counter:
        step()
    return counter.ops


def test_the_lean_step_stays_under_the_op_ceiling(monkeypatch):
    torch.manual_seed(0)
    config = get_preset("clevr", image_size=32, num_keyframes=2)
    decoder = CaptionDecoder(config).eval()
    memory = torch.randn(2, decoder.memory_len, config.dec_dim)
    model_state = decoder.setup_caches(2, 24, torch.float32, "cpu")
    decoder.prefill(memory, model_state)
    lean = LeanDecoder(decoder)
    lean_state = lean.setup_caches(2, 24, torch.float32, "cpu")
    lean.prefill(memory, lean_state)
    model_ops = _count_step(lambda: decoder.decode_step(model_state), monkeypatch)
    lean_ops = _count_step(lambda: lean.decode_step(lean_state), monkeypatch)
    assert len(lean_ops) <= MAX_STEP_OPS, f"{len(lean_ops)} ops (the model's step: {len(model_ops)}): {lean_ops}"
    assert len(model_ops) > 2 * MAX_STEP_OPS - 5  # the readable step (about 60): the ceiling is a real cut
    assert lean_ops.count("fused:add_layer_norm") == 3 * config.dec_layers and "fused:greedy_step" in lean_ops


def test_only_the_standard_decoder_with_sdpa_is_replaced(trained):
    model = trained[0]
    assert lean_decoding_supported(model.decoder, "sdpa")
    assert not lean_decoding_supported(model.decoder, "math")
    with pytest.raises(ValueError, match="SDPA backend"):
        LeanDecoder(model.decoder, "flash")
