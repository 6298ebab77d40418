"""The ``authors`` variant piece by piece: their LayerNorm, attention scale, positions, mask quirk, decoding rule."""

from __future__ import annotations

import math

import pytest
import torch

from procap.core.config import AuthorsVariant, ProCapConfig, config_from_dict
from procap.core.errors import ProCapError
from procap.model.authors_decoder import (
    AuthorsAttention,
    AuthorsLayerNorm,
    authors_greedy_decode,
    sinusoidal_positions,
)
from procap.model.decoder import BOS_ID, EOS_ID, MASK_ID, PAD_ID, UNK_ID
from procap.model.encoder import authors_prefix_mask
from procap.model.layers import FeedForward
from procap.model.procap import ProCap
from tests.support import small_config


def authors_config(**overrides) -> ProCapConfig:
    base = {"authors": {"enabled": True, "prefix_tokens": 5, "final_norm": False}, "enc_activation": "quick_gelu"}
    return small_config(**{**base, **overrides})


def test_layernorm_is_theirs_not_torchs():
    x = torch.tensor([[1.0, 2.0, 4.0, 9.0]])
    norm = AuthorsLayerNorm(4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
        norm.bias.copy_(torch.tensor([0.0, 1.0, 0.0, -1.0]))
    mean, std = 4.0, math.sqrt(((1 - 4) ** 2 + (2 - 4) ** 2 + 0 + (9 - 4) ** 2) / 3)  # unbiased: N - 1
    expected = torch.tensor([[1.0, 2.0, 0.5, 1.0]]) * (x - mean) / (std + 1e-6) + torch.tensor([0.0, 1.0, 0.0, -1.0])
    assert torch.allclose(norm(x), expected, atol=1e-6)
    torch_norm = torch.nn.functional.layer_norm(x, (4,), norm.weight, norm.bias, eps=1e-6)
    assert not torch.allclose(norm(x), torch_norm, atol=1e-2)  # biased variance would give another answer
    assert norm(x.bfloat16()).dtype == torch.bfloat16


def test_attention_divides_by_sqrt_hidden_and_is_causal():
    torch.manual_seed(0)
    attn = AuthorsAttention(8, heads=2)
    x = torch.randn(2, 5, 8)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    out = []
    for h in range(2):  # heads are contiguous chunks of the hidden dimension
        sl = slice(4 * h, 4 * h + 4)
        scores = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(8)  # sqrt(hidden), not sqrt(4)
        scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        out.append(scores.softmax(-1) @ v[..., sl])
    expected = attn.out_proj(torch.cat(out, dim=-1))
    assert torch.allclose(attn(x, causal=True), expected, atol=1e-6)
    changed = x.clone()
    changed[:, 3:] += 1.0
    assert torch.allclose(attn(changed, causal=True)[:, :3], attn(x, causal=True)[:, :3], atol=1e-6)
    assert all(p.bias is None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj))


def test_sinusoidal_positions_are_interleaved():
    pe = sinusoidal_positions(24, 16)
    for pos in (0, 1, 7, 23):
        for i in range(0, 16, 2):
            angle = pos / 10000 ** (i / 16)
            assert pe[pos, i].item() == pytest.approx(math.sin(angle), abs=2e-6)
            assert pe[pos, i + 1].item() == pytest.approx(math.cos(angle), abs=2e-6)


def test_prefix_mask_quirk():
    mask = authors_prefix_mask(26, 810)
    blocked = (~mask).nonzero().tolist()
    assert blocked == [[25, c] for c in range(25)] + [[26, c] for c in range(26)]


def test_quick_gelu_feed_forward():
    ffn = FeedForward(4, 8, activation="quick_gelu")
    x = torch.randn(3, 4)
    h = ffn.fc1(x)
    assert torch.allclose(ffn(x), ffn.fc2(h * torch.sigmoid(1.702 * h)))


def test_config_checks_the_variant():
    with pytest.raises(ValueError, match="authors.prefix_tokens must be >= 2 with authors.enabled"):
        small_config(authors={"enabled": True})
    with pytest.raises(ValueError, match="authors.prefix_tokens must be 0 without authors.enabled"):
        small_config(authors={"prefix_tokens": 4})
    with pytest.raises(ValueError, match="enc_activation"):
        small_config(enc_activation="relu")
    with pytest.raises(ValueError, match="authors.prefix_tokens must be an integer in"):
        config_from_dict(
            ProCapConfig, {**authors_config().to_dict(), "authors": {"enabled": True, "prefix_tokens": 10**9}}
        )
    with pytest.raises(ValueError, match="authors.enabled must be a bool"):
        config_from_dict(ProCapConfig, {**small_config().to_dict(), "authors": {"enabled": "yes"}})
    old = small_config().to_dict()
    for key in ("authors", "enc_activation"):
        old.pop(key)  # a checkpoint written before the variant existed
    assert ProCapConfig.from_dict(old) == small_config()


def _flat(config: ProCapConfig) -> dict:
    """``config`` as files wrote it before the authors' variant was grouped: three fields at the top level."""
    written = config.to_dict()
    group = written.pop("authors")
    variant = "authors" if group["enabled"] else "procap"
    return {
        **written,
        "variant": variant,
        "enc_prefix_tokens": group["prefix_tokens"],
        "enc_final_norm": group["final_norm"],
    }


def test_the_authors_variant_is_one_group_read_from_older_flat_files():
    grouped = authors_config()
    assert grouped.authors == AuthorsVariant(enabled=True, prefix_tokens=5, final_norm=False)
    written = grouped.to_dict()
    assert written["authors"] == {"enabled": True, "prefix_tokens": 5, "final_norm": False}  # the new form
    assert not {"variant", "enc_prefix_tokens", "enc_final_norm"} & set(written)
    for config in (grouped, small_config()):  # the authors' variant and the paper's model
        flat = _flat(config)
        assert config_from_dict(ProCapConfig, flat) == ProCapConfig.from_dict(flat) == config
    # a flat field overrides the group's, as the departures' do
    flat = {**written, "enc_prefix_tokens": 7}
    assert ProCapConfig.from_dict(flat).authors == AuthorsVariant(enabled=True, prefix_tokens=7, final_norm=False)
    for variant in ("mart", 1, None):
        with pytest.raises(ValueError, match="variant must be one of"):
            config_from_dict(ProCapConfig, {**_flat(grouped), "variant": variant})


def test_checkpoints_and_folders_with_the_flat_fields_load_into_the_group(tmp_path):
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from procap.data import Vocabulary
    from procap.loading.checkpoint import load_checkpoint, save_checkpoint

    vocab = Vocabulary(["red", "cube"])
    torch.manual_seed(0)
    model = ProCap(authors_config(vocab_size=len(vocab)))
    path = save_checkpoint(tmp_path / "new.safetensors", model, vocab)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    older = tmp_path / "old.safetensors"
    save_file(load_file(str(path)), str(older), metadata={**metadata, "config": json.dumps(_flat(model.config))})
    loaded, _, _ = load_checkpoint(older)
    assert loaded.config == model.config and loaded.config.authors.enabled
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    before, after = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    assert torch.equal(loaded.eval().memory(before, after), model.eval().memory(before, after))
    # a pretrained folder's config.json is compared with the weights' config: the flat form still describes them
    folder = model.save_pretrained(tmp_path / "folder", vocab)
    written = json.loads((folder / "config.json").read_text())
    del written["authors"]
    flat = {key: _flat(model.config)[key] for key in ("variant", "enc_prefix_tokens", "enc_final_norm")}
    (folder / "config.json").write_text(json.dumps({**written, **flat}))
    assert ProCap.from_pretrained(folder).config == model.config
    (folder / "config.json").write_text(json.dumps({**written, **flat, "enc_prefix_tokens": 6}))
    with pytest.raises(ProCapError, match="differs from the config stored"):
        ProCap.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**written, **flat, "variant": "mart"}))
    with pytest.raises(ProCapError, match="config.json: variant must be one of"):
        ProCap.from_pretrained(folder)


def test_model_parts_follow_the_variant():
    model = ProCap(authors_config())
    keys = model.state_dict().keys()
    assert "encoder.prefix" in keys and "decoder.out.bias" in keys and "encoder.norm.weight" not in keys
    assert not any(k.startswith(("encoder.text_embed", "encoder.msm_head", "decoder.embed")) for k in keys)
    assert "decoder.positions" not in keys  # rebuilt, not saved
    with pytest.raises(ProCapError, match="stage-2 model"):
        model.stage1_loss(torch.rand(2, 3, 3, 16, 16), torch.zeros(2, 8, dtype=torch.long))
    memory = model.memory(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16))
    assert memory.shape == (2, 3 * 16, 32)  # the prefix outputs are not part of the memory


def test_memory_ignores_nothing_but_depends_on_the_prefix():
    model = ProCap(authors_config()).eval()
    before, after = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    reference = model.memory(before, after)
    with torch.no_grad():
        model.encoder.prefix[0] += 1.0
    assert not torch.allclose(model.memory(before, after), reference)


def test_their_decoding_rule_keeps_going_after_eos_and_suppresses_only_unk():
    torch.manual_seed(0)
    model = ProCap(authors_config()).eval()
    with torch.no_grad():
        model.decoder.out.bias.zero_()
        model.decoder.out.bias[UNK_ID] = 1e4  # would win everywhere if not suppressed
        model.decoder.out.bias[EOS_ID] = 50.0  # wins the first step ...
        model.decoder.out.bias[MASK_ID] = 49.0
    memory = torch.randn(3, 48, 32)
    tokens = model.generate_from_memory(memory)
    assert tokens.shape == (3, 7) and not (tokens == UNK_ID).any()
    assert (tokens[:, 0] == EOS_ID).all()
    assert torch.equal(tokens, authors_greedy_decode(model.decoder, memory, 8))
    with torch.no_grad():
        model.decoder.out.bias[PAD_ID] = 60.0  # specials other than UNK can all be produced
    assert (model.generate_from_memory(memory) == PAD_ID).all()


def test_teacher_forced_logits_match_the_greedy_steps():
    torch.manual_seed(1)
    model = ProCap(authors_config()).eval()
    memory = torch.randn(2, 48, 32)
    tokens = model.generate_from_memory(memory)
    ids = torch.cat([torch.full((2, 1), BOS_ID), tokens], dim=1)
    logits = model.decoder(ids, memory)[:, :-1]
    logits[..., UNK_ID] = float("-inf")
    assert torch.equal(logits.argmax(-1), tokens)


def test_caption_text_rule():
    from procap.data import Vocabulary

    vocab = Vocabulary(["red", "cube", "caf\u00e9"])
    red, cube, cafe = vocab.stoi["red"], vocab.stoi["cube"], vocab.stoi["caf\u00e9"]
    row = [red, PAD_ID, MASK_ID, cafe, cube, EOS_ID, red, PAD_ID]
    assert ProCap(authors_config(vocab_size=len(vocab))).caption_text(vocab, row) == "red [MASK] caf cube"
    assert ProCap(small_config(vocab_size=len(vocab))).caption_text(vocab, row) == "red caf\u00e9 cube"


def test_stage2_loss_trains_every_part():
    from tests.support import random_captions

    model = ProCap(authors_config()).train()
    captions = random_captions(2, 8, 20)
    out = model.stage2_loss(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16), captions)
    out["loss"].backward()
    for name in (
        "encoder.prefix",
        "mask_embedding",
        "encoder.layers.0.attn.q_proj.weight",
        "memory_mlp.0.weight",
        "decoder.out.weight",
        "decoder.out.bias",
        "decoder.layers.0.self_norm.weight",
    ):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("variant", ["procap", "authors"])
def test_both_decoders_refuse_captions_longer_than_their_positions(variant):
    config = authors_config() if variant == "authors" else small_config()
    decoder = ProCap(config).decoder
    memory = torch.zeros(1, 3, config.dec_dim)
    decoder(torch.zeros(1, config.max_caption_len, dtype=torch.long), memory)  # the longest allowed
    with pytest.raises(ValueError, match="exceed max_caption_len"):
        decoder(torch.zeros(1, config.max_caption_len + 1, dtype=torch.long), memory)
