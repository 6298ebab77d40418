"""Attention layers, procedure encoder and caption decoder: shapes, orderings, causality, weight layout."""

from __future__ import annotations

import pytest
import torch

from procap.model.decoder import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SUPPRESSED_IDS,
    UNK_ID,
    CaptionDecoder,
    greedy_decode,
    suppress_specials,
)
from procap.model.encoder import ProcedureEncoder
from procap.model.layers import MultiHeadAttention
from procap.model.procap import ProCap
from tests.support import small_config


def test_attention_matches_torch_multihead_attention():
    mha = MultiHeadAttention(16, 4).eval()
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        ref.out_proj.bias.copy_(mha.out_proj.bias)
    x, context = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    torch.testing.assert_close(mha(x, context), ref(x, context, context, need_weights=False)[0])
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = blocked
    torch.testing.assert_close(mha(x, causal=True), ref(x, x, x, attn_mask=causal, need_weights=False)[0])
    mha.set_backend("math")
    torch.testing.assert_close(mha(x, causal=True), ref(x, x, x, attn_mask=causal, need_weights=False)[0])


def test_encoder_visual_tokens_are_frame_major_row_major():
    config = small_config()
    encoder = ProcedureEncoder(config)
    features = torch.randn(2, 3, 32, 4, 4)  # (B, T, z, h, w)
    tokens = encoder.embed_visual(features)
    assert tokens.shape == (2, 3 * 16, 32)
    b, t, r, c = 1, 2, 3, 1
    expected = encoder.visual_proj(encoder.visual_norm(features[b, t, :, r, c]))
    torch.testing.assert_close(tokens[b, t * 16 + r * 4 + c], expected)


def test_stage1_sequence_layout():
    model = ProCap(small_config())
    encoder = model.encoder
    text, visual = torch.randn(2, 5, 32), torch.randn(2, 12, 32)
    seq = model.stage1_sequence(text, visual)
    assert seq.shape == (2, 1 + 5 + 1 + 12, 32)
    assert torch.equal(seq[0, 0], encoder.align_token.detach()) and torch.equal(seq[1, 6], encoder.csy_token.detach())
    assert torch.equal(seq[:, 1:6], text) and torch.equal(seq[:, 7:], visual)
    assert encoder(seq).shape == seq.shape
    with pytest.raises(ValueError, match="at most 8"):
        encoder.embed_caption(torch.zeros(1, 9, dtype=torch.long))


def test_encoder_attends_bidirectionally():
    encoder = ProcedureEncoder(small_config()).eval()
    x = torch.randn(1, 6, 32)
    y = x.clone()
    y[0, -1] = torch.randn(32)  # (a constant shift would vanish in the LayerNorm)
    assert not torch.allclose(encoder(x)[0, 0], encoder(y)[0, 0])


def test_decoder_is_causal_and_tied():
    config = small_config()
    decoder = CaptionDecoder(config).eval()
    memory = torch.randn(2, 10, 32)
    tokens = torch.randint(8, 20, (2, 6))
    logits = decoder(tokens, memory)
    assert logits.shape == (2, 6, 20)
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 8) % 12 + 8
    torch.testing.assert_close(decoder(changed, memory)[:, :4], logits[:, :4])
    assert not torch.allclose(decoder(changed, memory)[:, 4], logits[:, 4])
    # Tied: no separate output matrix; the output projection is embed.weight.
    assert not any(p.shape == (20, 32) for n, p in decoder.named_parameters() if n != "embed.weight")
    logits.sum().backward()
    assert decoder.embed.weight.grad[PAD_ID].abs().sum() > 0  # PAD is never an input here: grad from the output


def test_bf16_decoder_logits_are_fp32_and_keep_near_ties_apart():
    # Two tied-embedding rows whose logits differ by less than bf16's spacing at that magnitude (0.0625 near 10): a
    # bf16 matmul rounds both to one value and argmax takes the lower id; the fp32 projection keeps the larger one.
    decoder = CaptionDecoder(small_config()).to(torch.bfloat16).eval()
    hidden = torch.zeros(1, 32, dtype=torch.bfloat16)
    hidden[0, 0] = 10.0
    with torch.no_grad():
        decoder.embed.weight.zero_()
        decoder.embed.weight[9, 0] = 1.0  # logit 10.0
        decoder.embed.weight[12, 0] = 1.0
        decoder.embed.weight[12, 1] = 0.0078125  # + 10 * 2**-7 via the second feature
    hidden[0, 1] = 1.0
    logits = decoder.logits(hidden)
    assert logits.dtype == torch.float32
    assert int(logits.argmax(-1)) == 12
    bf16_logits = hidden @ decoder.embed.weight.t()  # the old projection
    assert int(bf16_logits.argmax(-1)) == 9  # the flip this guards against
    memory = torch.randn(2, 10, 32, dtype=torch.bfloat16)
    state = decoder.setup_caches(2, 5, torch.bfloat16, "cpu", memory_len=10)
    decoder.prefill(memory, state)
    assert decoder.step_logits(state.tokens, state).dtype == torch.float32
    decoder.decode_step(state)
    assert state.logits.dtype == torch.float32
    assert decoder(torch.full((2, 3), BOS_ID), memory).dtype == torch.float32


def test_decoder_layer_exposes_weights_for_the_fast_path():
    layer = CaptionDecoder(small_config(dec_layers=2)).layers[1]
    for attn in (layer.self_attn, layer.cross_attn):
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            assert isinstance(getattr(attn, name), torch.nn.Linear)
    for name in ("norm1", "norm2", "norm3"):
        assert isinstance(getattr(layer, name), torch.nn.LayerNorm)
    assert isinstance(layer.ffn.fc1, torch.nn.Linear) and isinstance(layer.ffn.fc2, torch.nn.Linear)


def test_suppress_specials_keeps_eos_and_words():
    out = suppress_specials(torch.zeros(2, 12))
    assert torch.isinf(out[:, list(SUPPRESSED_IDS)]).all()
    assert torch.isfinite(out[:, [EOS_ID, 8, 11]]).all()
    assert UNK_ID in SUPPRESSED_IDS and BOS_ID in SUPPRESSED_IDS and PAD_ID in SUPPRESSED_IDS


class _ScriptedDecoder(torch.nn.Module):
    """Logits by step: UNK always on top, then a per-sample word or EOS."""

    def __init__(self, vocab: int, eos_step: list[int | None]) -> None:
        super().__init__()
        self.vocab, self.eos_step = vocab, eos_step

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        step = tokens.shape[1] - 1
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], self.vocab)
        logits[:, -1, UNK_ID] = 100.0
        logits[:, -1, PAD_ID] = 90.0
        for b, eos_at in enumerate(self.eos_step):
            word = 8 + (step + b) % (self.vocab - 8)
            logits[b, -1, EOS_ID if eos_at == step else word] = 50.0
        return logits


def test_greedy_decode_suppresses_unk_and_pads_after_eos():
    decoder = _ScriptedDecoder(vocab=12, eos_step=[2, None, 0])
    out = greedy_decode(decoder, torch.zeros(3, 1, 4), max_len=6)
    assert out.shape == (3, 5)
    assert out[0].tolist() == [8, 9, EOS_ID, PAD_ID, PAD_ID]
    assert out[1].tolist() == [9, 10, 11, 8, 9]
    assert out[2].tolist() == [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]
