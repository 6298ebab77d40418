"""One way to choose a fused form (``procap.model.fused_form``): ``use_fused`` on the VQGAN, the procedure encoder and
the caption decoder, and ``ProCap.use_fused`` for the three.

Each part's fused and readable forms must agree (VQGAN features and codes, the encoder's memory, the decoder's
per-step logits and tokens) on the ``tiny`` preset and on the paper's ``clevr`` preset made small, and switching to
the fused forms and back must give the readable results again, bit for bit, with the same state-dict keys.
"""

from __future__ import annotations

import pytest
import torch

from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.model.decoder import DecodingState
from procap.model.decoder_step import FusedDecodingState
from procap.model.procap import FUSED_PARTS, ProCap
from procap.model.vqgan_fused import FusedVQGANEncoder
from tests.support import small_config

CAPTION_LEN = 12
CONFIGS = {
    "tiny": lambda: get_preset("tiny", max_caption_len=CAPTION_LEN),
    # the paper's architecture (full-size f16 VQGAN, 768-wide encoder, 2 x 512 decoder, no departures), made small
    "clevr-small": lambda: get_preset(
        "clevr", image_size=32, num_keyframes=2, enc_layers=2, max_caption_len=CAPTION_LEN
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_and_pairs(request):
    """A random model of each configuration whose decoder gives varied tokens, and 4 image pairs."""
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    model = ProCap(config).eval()
    with torch.no_grad():  # random decoder weights scaled up: greedy tokens vary, so comparing them means something
        for weight in model.decoder.parameters():
            if weight.dim() > 1:
                weight.mul_(10)
    generator = torch.Generator().manual_seed(1)
    size = config.image_size
    before, after = (torch.rand(4, 3, size, size, generator=generator) for _ in range(2))
    return model, before, after


@torch.no_grad()
def _decode(decoder: torch.nn.Module, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, object]:
    """``(logits (B, steps, V), tokens (B, steps), state)`` of the decoder's cached loop over ``memory``."""
    state = decoder.setup_caches(memory.shape[0], CAPTION_LEN, memory.dtype, memory.device)
    decoder.prefill(memory, state)
    logits = []
    for _ in range(state.steps):
        decoder.decode_step(state)
        logits.append(state.logits.clone())
    return torch.stack(logits, 1), state.out.clone(), state


@torch.no_grad()
def _outputs(model: ProCap, before: torch.Tensor, after: torch.Tensor, memory: torch.Tensor | None = None) -> dict:
    """What each part gives in its current form: VQGAN features and codes, the memory, the tokens of the whole
    pipeline, and the decoder's per-step logits and tokens over ``memory`` (default: this form's own)."""
    own = model.memory(before, after)
    logits, tokens, state = _decode(model.decoder, own if memory is None else memory)
    return {
        "features": model.vqgan.features(before),
        "codes": model.vqgan.codes(before),
        "memory": own,
        "pipeline tokens": _decode(model.decoder, own)[1],
        "logits": logits,
        "tokens": tokens,
        "state": state,
    }


def _forms(model: ProCap) -> dict[str, bool]:
    return {name: getattr(model, name).fused for name in FUSED_PARTS}


def test_fused_and_readable_forms_agree_and_switching_round_trips(model_and_pairs):
    model, before, after = model_and_pairs
    keys = list(model.state_dict())
    model.use_fused(False)
    assert _forms(model) == dict.fromkeys(FUSED_PARTS, False)
    readable = _outputs(model, before, after)
    assert isinstance(readable["state"], DecodingState) and model.vqgan.encoder is model.vqgan.reference_encoder

    model.use_fused()
    assert _forms(model) == dict.fromkeys(FUSED_PARTS, True)
    assert isinstance(model.vqgan.encoder, FusedVQGANEncoder) and model.encoder.fused_add_norm
    assert list(model.state_dict()) == keys  # the fused forms share the parts' modules: no key added or lost
    fused = _outputs(model, before, after, memory=readable["memory"])  # the decoder compared on one memory
    assert isinstance(fused["state"], FusedDecodingState)

    # the fused forms compute what the readable ones do, up to fp32 rounding
    for name in ("features", "memory"):
        scale = readable[name].abs().max()
        assert (fused[name] - readable[name]).abs().max() <= 1e-5 * scale, name
    assert torch.equal(fused["codes"], readable["codes"])
    finite = torch.isfinite(readable["logits"])
    assert torch.equal(torch.isfinite(fused["logits"]), finite)  # the same ids suppressed
    scale = readable["logits"][finite].abs().max()
    assert (fused["logits"][finite] - readable["logits"][finite]).abs().max() <= 1e-5 * scale, scale
    assert torch.equal(fused["tokens"], readable["tokens"])
    assert len(set(readable["tokens"].flatten().tolist())) > 3  # varied tokens: a real comparison
    # the whole pipeline in either form gives the oracle's tokens (ProCap.generate: the readable parts, no cache)
    oracle = model.generate(before, after, max_len=CAPTION_LEN)
    assert torch.equal(fused["pipeline tokens"], oracle) and torch.equal(readable["pipeline tokens"], oracle)

    model.use_fused(False)  # back: the readable results again, bit for bit
    assert _forms(model) == dict.fromkeys(FUSED_PARTS, False) and not model.encoder.fused_add_norm
    again = _outputs(model, before, after)
    for name in ("features", "codes", "memory", "logits", "tokens", "pipeline tokens"):
        assert torch.equal(again[name], readable[name]), name
    assert list(model.state_dict()) == keys


def test_the_readable_decoder_form_serves_beam_search(model_and_pairs):
    # beam search reorders the readable form's prefix rows like the fused form's caches
    from procap.model.beam import beam_search, beam_search_cached

    model, before, after = model_and_pairs
    with torch.no_grad():
        memory = model.memory(before, after)
    expected = beam_search(model.decoder, memory, CAPTION_LEN, 3)
    for fused in (False, True):
        model.decoder.use_fused(fused)
        assert torch.equal(beam_search_cached(model.decoder, memory, CAPTION_LEN, 3), expected), fused
    assert model.decoder.fused


def test_one_part_at_a_time_and_options():
    model = ProCap(small_config()).eval()
    model.use_fused(vqgan=False, encoder={"gelu_epilogue": True})
    assert _forms(model) == {"vqgan": False, "encoder": True, "decoder": True}
    assert all(layer.mlp.gelu_epilogue for layer in model.encoder.layers) and model.encoder.fused_add_norm
    model.use_fused(vqgan={"downsample_4x4": False}, encoder=False, decoder=False)
    assert _forms(model) == {"vqgan": True, "encoder": False, "decoder": False}
    assert not model.vqgan.encoder.downsample_4x4
    assert not any(layer.mlp.gelu_epilogue for layer in model.encoder.layers)
    model.use_fused(False, vqgan=True)  # enabled=False: every part readable, whatever the choices say
    assert _forms(model) == dict.fromkeys(FUSED_PARTS, False)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda m: m.use_fused(tokenizer=True), "use_fused has no part 'tokenizer'"),
        (lambda m: m.use_fused(vqgan="yes"), "vqgan must be True, False or a dict"),
        (lambda m: m.use_fused(encoder={"add_nrom": False}), "ProcedureEncoder.use_fused has no option 'add_nrom'"),
        (
            lambda m: m.use_fused(decoder={"fast": True}),
            r"CaptionDecoder.use_fused has no option 'fast' \(its options: logits_pick, kv_cache_dtype",
        ),
        (lambda m: m.vqgan.use_fused(False, channels_last=True), r"VQGAN.use_fused\(False\) takes no options"),
        (
            lambda m: m.use_fused(encoder={"gelu_epilogue": True, "gelu_erf_epilogue": True}),
            "one GELU epilogue: gelu_epilogue or gelu_erf_epilogue",
        ),
    ],
)
def test_bad_choices_are_refused_in_one_sentence(call, message):
    model = ProCap(small_config()).eval()
    with pytest.raises(ProCapError, match=message):
        call(model)
    assert _forms(model) == {"vqgan": False, "encoder": False, "decoder": True}  # nothing chosen
