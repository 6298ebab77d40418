"""``Captioner(precision="fp8")`` and ``kv_cache_dtype="fp8"`` on the CPU (the fake-quant reference), the settings'
choices and refusals, and the FP8 agreement gate (issue 52)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from procap.core.errors import ProCapError
from procap.fast import Captioner
from procap.fast.agreement import Fp8Agreement, fp8_agreement, fp8_captioner
from procap.fast.settings import resolve_settings
from procap.kernels import fp8
from procap.model.decoder_step import FusedDecodingState
from procap.model.fp8_linear import ENCODER_LINEARS, Fp8Linear, RowCache, is_quantized
from tests.support import IdVocab

OPTIONS = {"device": "cpu", "max_len": 16, "batch_sizes": (1, 4, 8)}


def _fake_quant_model(model):
    """The model with every encoder GEMM written out as fake quantisation: dequantised weights, inputs quantised per
    row by a hook. An independent statement of what the FP8 encoder computes."""
    model = copy.deepcopy(model)
    for layer in model.encoder.layers:
        for part, name in ENCODER_LINEARS:
            linear = getattr(getattr(layer, part), name)
            linear.weight.data = fp8.dequantize(fp8.quantize_weight(linear.weight.data))
            linear.register_forward_pre_hook(lambda _m, args: (fp8.dequantize(fp8.quantize_rows(args[0])),))
    return model


def test_bf16_stays_the_default_and_fp8_swaps_the_encoder_gemms(trained):
    model = trained[0]
    default = Captioner(model, IdVocab(), configure_as="cuda", **OPTIONS)
    assert default.settings.precision == "bf16" and default.settings.fp8_gemm is None
    assert not is_quantized(default.model.encoder) and default.settings.kv_cache_dtype is None
    captioner = Captioner(model, IdVocab(), configure_as="cuda", precision="fp8", **OPTIONS)
    assert captioner.settings.fp8_gemm == "reference" and captioner.dtype == torch.bfloat16
    swapped = [m for m in captioner.model.encoder.modules() if isinstance(m, Fp8Linear)]
    assert len(swapped) == 6 * len(model.encoder.layers)
    assert not is_quantized(model.encoder)  # the caller's model is left as it is


def test_the_fp8_encoder_is_fake_quantisation_of_every_gemm(trained, pairs):
    model = trained[0]
    # The readable VQGAN: the fused one's last-bit differences move values across e4m3 rounding boundaries.
    captioner = Captioner(model, IdVocab(), dtype="fp32", precision="fp8", fused_vqgan=False, **OPTIONS)
    with torch.no_grad():
        expected = _fake_quant_model(model).memory(*pairs)
        plain = model.memory(*pairs)
    got = captioner.memory(*pairs)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, plain, rtol=1e-5, atol=1e-5)  # FP8 did change the values


def test_q_k_v_quantise_their_shared_input_once(trained, pairs, monkeypatch):
    captioner = Captioner(trained[0], IdVocab(), dtype="fp32", precision="fp8", **OPTIONS)
    calls = []
    original = fp8.quantize_rows
    monkeypatch.setattr(fp8, "quantize_rows", lambda x: calls.append(x.shape) or original(x))
    captioner.memory(*pairs)
    assert len(calls) == 4 * len(captioner.model.encoder.layers)  # q/k/v once, out_proj, fc1, fc2


def test_fp8_survives_a_move_and_a_cast(trained, pairs):
    captioner = Captioner(trained[0], IdVocab(), configure_as="cuda", precision="fp8", **OPTIONS)
    layer = captioner.model.encoder.layers[0].attn.q_proj
    codes, scale = (t.clone() for t in layer.weight_e4m3)
    captioner.to("cpu", torch.float32)
    layer = captioner.model.encoder.layers[0].attn.q_proj
    assert isinstance(layer, Fp8Linear) and layer.bias.dtype == torch.float32
    assert torch.equal(layer.weight_e4m3.codes.float(), codes.float()) and torch.equal(layer.weight_e4m3.scale, scale)
    assert captioner.generate(*pairs).shape == (12, 15)


def test_the_fp8_cross_cache_decodes_the_quantised_keys_and_values(trained, pairs):
    model = trained[0]
    exact = Captioner(model, IdVocab(), dtype="fp32", **OPTIONS)
    cached = Captioner(model, IdVocab(), dtype="fp32", kv_cache_dtype="fp8", **OPTIONS)
    memory = exact.memory(*pairs)[:4]
    decoder, reference = cached.model.decoder, exact.model.decoder
    state = decoder.setup_caches(4, 16, torch.float32, "cpu")
    plain = reference.setup_caches(4, 16, torch.float32, "cpu")
    assert isinstance(state, FusedDecodingState) and state.cross_kv_e4m3 is not None and plain.cross_kv_e4m3 is None
    assert state.cross_kv[0] is state.cross_kv[-1]  # one working buffer for every layer
    decoder.prefill(memory, state)
    reference.prefill(memory, plain)
    for index, buffer in enumerate(plain.cross_kv):  # the plain cache, fake-quantised by hand per token and head
        heads = buffer.view(4, buffer.shape[1], 2 * reference.layers[0].self_attn.heads, -1)
        heads.copy_(fp8.dequantize(fp8.quantize_rows(heads)))
        assert torch.equal(state.cross_kv_e4m3.codes[index].float(), fp8.quantize_rows(heads).codes.float())
    for _ in range(state.steps):
        decoder.decode_step(state)
        reference.decode_step(plain)
    assert torch.equal(state.out, plain.out)


def test_the_gate_measures_fp8_against_bf16_and_refuses_a_model_below_its_minimum(trained, pairs):
    """The fixture's decoder is partly trained (small margins, half its pairs random images): FP8 changes 3 of its 12
    captions, so it passes a gate of 50 % and is refused at the real 97 %. A no-op FP8 path would pass both."""
    gate = fp8_agreement(trained[0], *pairs, configure_as="cuda", kv_cache_dtype="fp8", **OPTIONS)
    assert gate.figures["pairs"] == 12 and gate.bf16_tokens.shape == gate.fp8_tokens.shape == (12, 15)
    assert 0.5 <= gate.caption_agreement < 0.97
    with pytest.raises(ProCapError, match=r"FP8 refused for this model: its captions equal the bf16 ones on .* of 12"):
        fp8_captioner(trained[0], IdVocab(), *pairs, configure_as="cuda", **OPTIONS)
    passing = fp8_captioner(trained[0], IdVocab(), *pairs, configure_as="cuda", minimum=0.5, **OPTIONS)
    assert passing.settings.precision == "fp8" and isinstance(passing.fp8_gate, Fp8Agreement)
    assert passing.fp8_gate.passed


def test_the_gate_sentence_names_the_figures():
    gate = Fp8Agreement({"pairs": 400, "caption_agreement": 0.95}, 0.97, torch.zeros(1), torch.zeros(1))
    assert not gate.passed
    with pytest.raises(ProCapError, match=r"on 95.0% of 400 pairs, below the gate's 97%; caption in bf16\.$"):
        gate.require()


def test_fp8_is_refused_on_a_gpu_without_it_and_chosen_on_one_with_it(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    for options in ({"precision": "fp8"}, {"kv_cache_dtype": "fp8"}):
        with pytest.raises(ProCapError, match=r"FP8 needs a GPU with FP8 tensor cores .*; cuda has 8\.0\.$"):
            resolve_settings(cuda, torch.bfloat16, attention_backend="sdpa", **options)
    assert resolve_settings(cuda, torch.bfloat16, attention_backend="sdpa").fp8_gemm is None  # bf16: no question
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_settings(cuda, torch.bfloat16, attention_backend="sdpa", precision="fp8").fp8_gemm == "scaled_mm"
    with pytest.raises(ProCapError, match="use dtype='bf16'"):
        resolve_settings(cuda, torch.float16, attention_backend="sdpa", precision="fp8")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"precision": "fp4"}, "precision must be one of bf16, fp8, got 'fp4'"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype must be None, 'fp8' or torch.float8_e4m3fn, got 'int8'"),
        ({"precision": "fp8", "fused_encoder": {"gelu_epilogue": True}}, "leave fused_encoder's gelu_epilogue off"),
        (
            {"precision": "fp8", "fused_encoder": {"gelu_erf_epilogue": True}},
            "leave fused_encoder's gelu_erf_epilogue off",
        ),
        ({"kv_cache_dtype": "fp8", "fused_decoder": False}, "leave fused_decoder on"),
    ],
)
def test_bad_fp8_choices_are_refused_in_one_sentence(trained, options, message):
    with pytest.raises(ProCapError, match=message):
        Captioner(trained[0], IdVocab(), **OPTIONS, **options)


def test_fp8_linear_has_no_backward():
    layer = Fp8Linear(torch.nn.Linear(16, 16), "reference", RowCache())
    x = torch.randn(2, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="inference form"):
        layer(x)
    with torch.no_grad():
        dequantised = fp8.dequantize(layer.weight_e4m3)
        torch.testing.assert_close(layer(x), F.linear(x, dequantised, layer.bias), rtol=0.05, atol=0.05)


def test_an_fp8_cache_keeps_the_callers_other_decoder_options():
    """Captioner(fused_decoder={"logits_pick": True}, kv_cache_dtype="fp8") asks the decoder for both."""
    from procap.fast.settings import fp8_decoder_choice
    from procap.kernels import fp8

    assert fp8_decoder_choice({"logits_pick": True}, fp8.E4M3) == {"logits_pick": True, "kv_cache_dtype": fp8.E4M3}
    assert fp8_decoder_choice(True, fp8.E4M3) == {"kv_cache_dtype": fp8.E4M3}
    assert fp8_decoder_choice(False, fp8.E4M3) is False  # the readable decoder keeps no such cache
    assert fp8_decoder_choice({"logits_pick": True}, None) == {"logits_pick": True}
