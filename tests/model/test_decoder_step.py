"""The caption decoder's fused cached step (``procap.model.decoder_step``) against the oracle, and its op count.

The oracle is the decoder's ``forward`` over the whole prefix (``greedy_decode``): every step's fp32 logits and the
tokens must match it, with every attention backend this machine has and through both kernel implementations. At
decoding batch sizes each op of the step is a few microseconds of launch latency, so the number of ops is the cost;
the count test makes a regression fail on a CPU.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from procap import kernels
from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.kernels import dispatch
from procap.kernels.attention import attention, available_backends
from procap.model import decoder_step
from procap.model.beam import beam_search, beam_search_cached
from procap.model.decoder import BOS_ID, CaptionDecoder, greedy_decode, suppress_specials

MAX_STEP_OPS = 30  # the clevr decoder (2 layers): 13 per layer, a LayerNorm, the logits GEMM and the pick


pytestmark = pytest.mark.usefixtures("fresh_dispatch")


def _decode_both(decoder: torch.nn.Module, memory: torch.Tensor, max_len: int):
    """Per step: (oracle logits over the whole prefix, cached step logits), and both token outputs at the end."""
    state = decoder.setup_caches(memory.shape[0], max_len, memory.dtype, memory.device)
    decoder.prefill(memory, state)
    prefix = torch.full((memory.shape[0], 1), BOS_ID, dtype=torch.long, device=memory.device)
    logits = []
    for _ in range(state.steps):
        decoder.decode_step(state)
        with torch.no_grad():
            logits.append((suppress_specials(decoder(prefix, memory)[:, -1].float()), state.logits.clone()))
        prefix = torch.cat([prefix, state.out[:, state.pos - 1]], dim=1)
    return logits, greedy_decode(decoder, memory, max_len), state.out


# The interpreter runs each Triton program in Python: fewer rows and steps there.
@pytest.mark.parametrize("impl,rows,max_len", [("reference", 6, 16), ("triton", 3, 6)], ids=["reference", "triton"])
def test_fp32_logits_and_tokens_equal_the_oracle(trained, pairs, impl, rows, max_len, monkeypatch):
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(pairs[0][:rows], pairs[1][:rows])
    monkeypatch.setenv("PROCAP_KERNELS", impl)  # for the decoding ops only
    kernels.reset_dispatch()
    logits, oracle_out, step_out = _decode_both(model.decoder, memory, max_len)
    assert torch.equal(step_out, oracle_out)
    assert len(set(oracle_out.flatten().tolist())) > 2  # the trained fixture's tokens vary: a real comparison
    for ref, got in logits:
        finite = torch.isfinite(ref)
        assert torch.equal(finite, torch.isfinite(got))  # the same ids suppressed
        torch.testing.assert_close(got[finite], ref[finite], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("backend", available_backends("cpu", torch.float32))
def test_every_attention_backend_decodes_like_the_oracle(trained, pairs, backend, monkeypatch):
    # Every backend takes the step's additive mask through procap.kernels.attention.attention, the one attention
    # entry: two calls per layer and step (self- and cross-attention), with the layers' backend.
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(pairs[0][:5], pairs[1][:5])
    backends = []

    def counted(*args, backend, **kwargs):
        backends.append(backend)
        return attention(*args, backend=backend, **kwargs)

    monkeypatch.setattr(decoder_step, "attention", counted)
    model.set_attention_backend(backend)
    try:
        logits, oracle_out, step_out = _decode_both(model.decoder, memory, 12)
    finally:
        model.set_attention_backend("auto")
    assert backends == [backend] * (2 * len(model.decoder.layers) * 11)
    assert torch.equal(step_out, oracle_out)
    for ref, got in logits:
        finite = torch.isfinite(ref)
        torch.testing.assert_close(got[finite], ref[finite], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_through_the_fused_step_equals_the_oracle(trained, pairs, num_beams):
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(*pairs)
    expected = beam_search(model.decoder, memory, 12, num_beams)
    assert torch.equal(beam_search_cached(model.decoder, memory, 12, num_beams), expected)


def test_buffers_live_with_the_weights(trained):
    decoder = trained[0].decoder
    with pytest.raises(ValueError, match="live with the weights"):
        decoder.setup_caches(2, 8, torch.float64, "cpu")
    with pytest.raises(ProCapError, match="max_len must be at most"):  # validate.caption_length, as every entry
        decoder.setup_caches(2, 99, torch.float32, "cpu")
    assert decoder.setup_caches(2, 8, torch.float32, torch.device("cpu:0")).steps == 7


def test_bf16_triton_step_follows_the_model_step(trained, pairs, monkeypatch):
    model = trained[0]
    with torch.no_grad():
        memory = model.memory(pairs[0][:2], pairs[1][:2])
    monkeypatch.setenv("PROCAP_KERNELS", "triton")
    kernels.reset_dispatch()
    decoder = CaptionDecoder(model.config)
    decoder.load_state_dict(model.decoder.state_dict())
    fp32_state = decoder.eval().setup_caches(2, 2, torch.float32, "cpu")
    decoder.prefill(memory, fp32_state)
    decoder.decode_step(fp32_state)
    decoder.to(torch.bfloat16)
    logits, _, _ = _decode_both(decoder, memory.to(torch.bfloat16), 2)
    ref, got = fp32_state.logits, logits[0][1]  # the first step: the same input token, so only rounding differs
    finite = torch.isfinite(ref)
    assert (got[finite] - ref[finite]).abs().max() <= 0.05 * ref[finite].abs().max()


@pytest.mark.parametrize(
    "impl,dtype", [("reference", torch.float32), ("triton", torch.float32), ("triton", torch.bfloat16)], ids=str
)
def test_the_fused_logits_pick_decodes_as_the_step_before_it(trained, pairs, impl, dtype, monkeypatch):
    # logits_pick replaces the logits GEMM and the pick's full scan (kernels.greedy_logits_step): the same tokens as
    # the step without it, and the same fp32 logits up to the summation order.
    decoder = CaptionDecoder(trained[0].config)
    decoder.load_state_dict(trained[0].decoder.state_dict())
    decoder.eval().to(dtype)
    with torch.no_grad():
        memory = trained[0].memory(pairs[0][:3], pairs[1][:3]).to(dtype)
    monkeypatch.setenv("PROCAP_KERNELS", impl)
    kernels.reset_dispatch()
    before_logits, _, before_out = _decode_both(decoder, memory, 6)
    decoder.use_fused(logits_pick=True)
    after_logits, oracle_out, after_out = _decode_both(decoder, memory, 6)
    assert torch.equal(after_out, before_out)
    if dtype == torch.float32:
        assert torch.equal(after_out, oracle_out)
    for (_, before), (_, after) in zip(before_logits, after_logits):
        assert torch.equal(torch.isinf(after), torch.isinf(before))
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def _trained_decoder(trained, pairs, dtype) -> tuple[CaptionDecoder, torch.Tensor]:
    """The trained fixture's decoder in ``dtype`` and the memory of its first three pairs."""
    decoder = CaptionDecoder(trained[0].config)
    decoder.load_state_dict(trained[0].decoder.state_dict())
    decoder.eval().to(dtype)
    with torch.no_grad():
        memory = trained[0].memory(pairs[0][:3], pairs[1][:3]).to(dtype)
    return decoder, memory


@pytest.mark.parametrize(
    "impl,dtype", [("reference", torch.float32), ("triton", torch.float32), ("triton", torch.bfloat16)], ids=str
)
def test_the_split_k_cross_attention_decodes_as_the_step_before_it(trained, pairs, impl, dtype, monkeypatch):
    # split_k_attention runs the cross attention through kernels.decode_attention (the tiny fixture's 90 memory
    # tokens: two splits): the same greedy tokens as the step on its backend, the logits up to the softmax's
    # summation order (and, in bf16, the rounding of the attended values).
    decoder, memory = _trained_decoder(trained, pairs, dtype)
    assert memory.shape[1] > kernels.split_k_attention.SPLIT_KEYS  # more than one split
    monkeypatch.setenv("PROCAP_KERNELS", impl)
    kernels.reset_dispatch()
    before_logits, _, before_out = _decode_both(decoder, memory, 6)
    decoder.use_fused(split_k_attention=True)
    after_logits, _, after_out = _decode_both(decoder, memory, 6)
    assert torch.equal(after_out, before_out)
    assert len(set(after_out.flatten().tolist())) > 2  # varied tokens: a real comparison
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    for (_, before), (_, after) in zip(before_logits, after_logits):
        finite = torch.isfinite(before)
        assert torch.equal(finite, torch.isfinite(after))
        torch.testing.assert_close(after[finite], before[finite], **tolerance)


@pytest.mark.parametrize(
    "impl,dtype", [("reference", torch.float32), ("triton", torch.float32), ("triton", torch.bfloat16)], ids=str
)
def test_the_fused_mlp_decodes_as_the_step_before_it(trained, pairs, impl, dtype, monkeypatch):
    # mlp: each layer's fc1, GELU and fc2 in one op (kernels.decode_mlp): the same tokens as the step without it and
    # the same logits up to the GEMMs' summation order; through the reference, the same bits (the same ops).
    decoder, memory = _trained_decoder(trained, pairs, dtype)
    monkeypatch.setenv("PROCAP_KERNELS", impl)
    kernels.reset_dispatch()
    before_logits, _, before_out = _decode_both(decoder, memory, 6)
    decoder.use_fused(mlp=True)
    assert decoder.setup_caches(3, 6, dtype, "cpu").mlp_workspace is not None
    after_logits, oracle_out, after_out = _decode_both(decoder, memory, 6)
    assert torch.equal(after_out, before_out)
    if dtype == torch.float32:
        assert torch.equal(after_out, oracle_out)
    for (_, before), (_, after) in zip(before_logits, after_logits):
        assert torch.equal(torch.isinf(after), torch.isinf(before))
        if impl == "reference":
            assert torch.equal(after, before)
        else:  # bf16: a hidden value may round the other way; the logits are fp32 of a bf16 stream
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(after, before, rtol=tolerance, atol=tolerance)


def test_greedy_tokens_of_the_tiny_preset_are_equal_with_the_fused_mlp(monkeypatch):
    # The check: random weights of the tiny preset, fp32, the Triton kernel (interpreted here) on and off.
    torch.manual_seed(0)
    decoder = CaptionDecoder(get_preset("tiny")).eval()
    for p in decoder.parameters():  # away from init's zero biases and small weights: varied tokens
        p.data.add_(torch.randn_like(p) * 0.2)
    memory = torch.randn(3, 20, decoder.embed.weight.shape[1])
    monkeypatch.setenv("PROCAP_KERNELS", "triton")
    kernels.reset_dispatch()
    launches = []
    real = kernels.decode_mlp
    monkeypatch.setattr(kernels, "decode_mlp", lambda *args: launches.append(args[0].shape) or real(*args))
    off = decoder.generate_cached(memory, 10)
    decoder.use_fused(mlp=True)
    on = decoder.generate_cached(memory, 10)
    assert torch.equal(on, off)
    assert len(set(off.flatten().tolist())) > 2  # the tokens vary: a real comparison
    assert launches == [(3, decoder.embed.weight.shape[1])] * (len(decoder.layers) * 9)


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
    for module in (
        kernels.layernorm,
        kernels.greedy,
        kernels.logits_pick,
        kernels.split_k_attention,
        sys.modules["procap.kernels.decode_mlp"],
    ):
        monkeypatch.setattr(module, "run", one_launch)
    with torch.no_grad(), counter:
        step()
    return list(counter.ops)  # a copy: a later count's patched run wraps this one's and would append to it


def test_the_step_stays_under_the_op_ceiling(monkeypatch):
    torch.manual_seed(0)
    config = get_preset("clevr", image_size=32, num_keyframes=2)
    decoder = CaptionDecoder(config).eval()
    memory = torch.randn(2, decoder.memory_len, config.dec_dim)
    state = decoder.setup_caches(2, 24, torch.float32, "cpu")
    decoder.prefill(memory, state)
    step_ops = _count_step(lambda: decoder.decode_step(state), monkeypatch)
    assert len(step_ops) <= MAX_STEP_OPS, f"{len(step_ops)} ops: {step_ops}"
    assert step_ops.count("fused:add_layer_norm") == 3 * config.dec_layers and "fused:greedy_step" in step_ops
    # The layers as written take more for one position even without caches, a pick or the EOS bookkeeping.
    layer_ops = _count_step(lambda: decoder(torch.full((2, 1), BOS_ID), memory), monkeypatch)
    assert len(layer_ops) > len(step_ops) + 10, (len(layer_ops), len(step_ops))
    # logits_pick: the logits GEMM is gone into the pick's op
    decoder.use_fused(logits_pick=True)
    state = decoder.setup_caches(2, 24, torch.float32, "cpu")
    decoder.prefill(memory, state)
    pick_ops = _count_step(lambda: decoder.decode_step(state), monkeypatch)
    assert "fused:greedy_logits_step" in pick_ops and "fused:greedy_step" not in pick_ops
    assert len(pick_ops) == len(step_ops) - 1 and pick_ops.count("addmm") == step_ops.count("addmm") - 1
    # split_k_attention: each layer's cross attention is the split-K op (two launches on a GPU) instead of SDPA's
    decoder.use_fused(split_k_attention=True)
    state = decoder.setup_caches(2, 24, torch.float32, "cpu")
    decoder.prefill(memory, state)
    split_ops = _count_step(lambda: decoder.decode_step(state), monkeypatch)
    assert split_ops.count("fused:decode_attention") == config.dec_layers and len(split_ops) == len(step_ops)
    # mlp: each layer's two GEMMs and GELU are one op
    decoder.use_fused(mlp=True)
    state = decoder.setup_caches(2, 24, torch.float32, "cpu")
    decoder.prefill(memory, state)
    mlp_ops = _count_step(lambda: decoder.decode_step(state), monkeypatch)
    assert mlp_ops.count("fused:decode_mlp") == config.dec_layers and "gelu" not in mlp_ops
    assert len(mlp_ops) == len(step_ops) - 2 * config.dec_layers
    assert mlp_ops.count("addmm") == step_ops.count("addmm") - 2 * config.dec_layers


def test_the_fused_mlp_refuses_layers_without_the_erf_gelu():
    # The kernel computes the erf GELU: a decoder whose layers use another activation is refused in one sentence.
    from procap.core.errors import ProCapError

    decoder = CaptionDecoder(get_preset("tiny")).eval()
    decoder.layers[0].ffn.activation = torch.relu
    decoder.use_fused(mlp=True)
    with pytest.raises(ProCapError, match="fused_decoder option mlp computes the erf GELU"):
        decoder.setup_caches(2, 6, torch.float32, "cpu")
