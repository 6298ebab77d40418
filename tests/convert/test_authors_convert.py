"""The converter on a configuration other than the fixture's (sizes from the tensors), against an independent
restatement of the authors' model on their raw keys, and its one-sentence refusals."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from procap.convert import convert_authors_checkpoint
from procap.core.errors import ProCapError
from procap.loading.checkpoint import load_checkpoint, save_checkpoint

from .authors_format import (
    DEC,
    IG,
    AuthorsSpec,
    authors_state_dict,
    reference_greedy,
    reference_logits,
    reference_memory,
    reference_positions,
    write_authors_checkpoint,
    write_vocab,
)

SPEC = AuthorsSpec()  # 32 px, f4 VQGAN with level attention, k = 1, 3 x 64 encoder, 3 x 48 decoder (4 heads)


@pytest.fixture(scope="module")
def authors_files(tmp_path_factory):
    """``(checkpoint, vocab, state)`` written in the authors' format (``weights_0`` axial spelling, as 0.2.x)."""
    root = tmp_path_factory.mktemp("authors")
    state = authors_state_dict(SPEC, seed=11, axial="weights_0")
    write_authors_checkpoint(root / "model.chkpt", SPEC, state)
    write_vocab(root / "word2idx.json", SPEC.vocab)
    canonical = {k.replace("weights_", "weights."): v for k, v in state.items()}
    return root / "model.chkpt", root / "word2idx.json", canonical


@pytest.fixture(scope="module")
def converted(authors_files):
    checkpoint, vocab_path, _ = authors_files
    return convert_authors_checkpoint(checkpoint, vocab_path)


def test_every_size_comes_from_the_file(converted):
    model, vocab, info = converted
    c = model.config
    assert (c.authors.enabled, c.enc_activation, c.authors.final_norm) == (True, "quick_gelu", False)
    assert (c.image_size, c.grid_size, c.num_keyframes, c.authors.prefix_tokens) == (32, 8, 1, SPEC.slots + 2)
    assert (c.enc_dim, c.enc_heads, c.enc_mlp, c.enc_layers) == (64, 1, 256, 3)
    assert (c.dec_dim, c.dec_heads, c.dec_ffn, c.dec_layers, c.max_caption_len) == (48, 4, 96, 3, 12)
    assert (c.vocab_size, len(vocab)) == (30, 30)
    v = c.vqgan
    assert (v.ch, v.ch_mult, v.num_res_blocks, v.z_channels, v.n_embed, v.attn_resolutions) == (
        32,
        (1, 1, 2),
        2,
        16,
        64,
        (16,),
    )
    assert info["epoch"] == 3 and info["dataset"] == "spot" and info["ignored_keys"] > 0


def test_tensors_land_where_the_authors_used_them(converted, authors_files):
    model, _, _ = converted
    state = authors_files[2]
    ours = model.state_dict()
    d = SPEC.width
    in_proj = state[IG + "transformer.transformer.resblocks.2.attn.in_proj_weight"]
    assert torch.equal(ours["encoder.layers.2.attn.k_proj.weight"], in_proj[d : 2 * d])
    assert torch.equal(
        ours["encoder.prefix"][3], state[IG + "text_emb.weight"][3] + state[IG + "text_pos_emb.weight"][3]
    )
    special = state[IG + "special_emb.weight"] + state[IG + "special_pos_emb.weight"]
    assert torch.equal(ours["encoder.prefix"][-2:], special[1:3])
    assert torch.equal(ours["pos_row"], state[IG + "target_pos_emb.weights.1"].reshape(-1, d))
    assert torch.equal(ours["decoder.layers.2.cross_norm.weight"], state[DEC + "layers.2.attention.layernorm.gamma"])
    assert torch.equal(ours["decoder.out.bias"], state[DEC + "out.bias"])
    assert torch.equal(
        ours["vqgan.encoder.down.1.attn.0.q.weight"], state[IG + "vae.model.encoder.down.1.attn.0.q.weight"]
    )


def _check_against_reference(model, state, spec: AuthorsSpec) -> None:
    """fp64 on both sides: memory, teacher-forced logits on random ids, and greedy tokens."""
    model = copy.deepcopy(model).double()
    # The positional table is an fp32 buffer (as theirs); use the exact one here (tests/model checks ours to 1e-6).
    model.decoder.positions.copy_(reference_positions(*model.decoder.positions.shape))
    gen = torch.Generator().manual_seed(0)
    size = spec.image
    before, after = (torch.rand(3, 3, size, size, generator=gen, dtype=torch.float64) for _ in range(2))
    ids = torch.randint(0, spec.vocab, (3, spec.max_t_len), generator=gen)
    ids[:, 0] = 4
    with torch.no_grad():
        memory = model.memory(before, after)
        features = model.frame_features(torch.stack([before, after], dim=1))
        assert (memory - reference_memory(state, features, spec)).abs().max().item() < 1e-10
        logits = model.decoder(ids, memory)
        assert (logits - reference_logits(state, ids, memory, spec)).abs().max().item() < 1e-10
        assert logits.std().item() > 0.5  # not a degenerate decoder
        tokens = model.generate(before, after)
    assert torch.equal(tokens, reference_greedy(state, memory, spec))


def test_matches_an_independent_restatement_of_their_model(converted, authors_files):
    _check_against_reference(converted[0], authors_files[2], SPEC)


def test_widths_that_are_not_multiples_of_64_and_other_lengths(tmp_path):
    # CLIP's heads are width // 64: 96 gives one 96-wide head. k = 2, 4 caption slots, an f2 VQGAN (16 x 16 grid).
    spec = AuthorsSpec(
        ch_mult=(1, 2),
        res_blocks=1,
        attn_resolutions=(),
        z=32,
        width=96,
        blocks=2,
        frames=4,
        slots=4,
        hidden=40,
        dec_heads=5,
        dec_layers=1,
        ffn=80,
        vocab=20,
        max_t_len=9,
    )
    state = authors_state_dict(spec, seed=5)
    model, _, _ = convert_authors_checkpoint(*_write(tmp_path, state, spec))
    c = model.config
    assert (c.enc_heads, c.grid_size, c.num_keyframes, c.authors.prefix_tokens, c.dec_heads) == (1, 16, 2, 6, 5)
    _check_against_reference(model, state, spec)


def test_fast_path_and_checkpoint_round_trip(converted, tmp_path):
    from procap.fast import Captioner

    model, vocab, info = converted
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab, info)
    loaded, loaded_vocab, _ = load_checkpoint(path)
    gen = torch.Generator().manual_seed(1)
    before, after = (torch.rand(5, 3, 32, 32, generator=gen) for _ in range(2))
    oracle = model.float().generate(before, after)
    assert torch.equal(loaded.generate(before, after), oracle)
    captioner = Captioner.from_checkpoint(
        path, device="cpu", dtype="fp32", max_len=None, batch_sizes=(2, 4), pad_to_bucket=True
    )
    assert torch.equal(captioner.generate(before, after), oracle)
    assert captioner(list(before), list(after)) == [loaded.caption_text(loaded_vocab, r) for r in oracle.tolist()]


def _write(tmp_path, state, spec=SPEC, vocab=None):
    write_authors_checkpoint(tmp_path / "m.chkpt", spec, state)
    write_vocab(tmp_path / "v.json", vocab or spec.vocab)
    return tmp_path / "m.chkpt", tmp_path / "v.json"


def test_both_axial_spellings_and_a_ddp_prefix_give_the_same_model(tmp_path, converted):
    state = authors_state_dict(SPEC, seed=11)  # weights.0 spelling
    wrapped = type(state)(("module." + k, v) for k, v in state.items())
    model, _, _ = convert_authors_checkpoint(*_write(tmp_path, wrapped))
    reference = converted[0].float().state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "change,needle",
    [
        (
            lambda s: s.update({IG + "new_head.weight": torch.zeros(2)}),
            "does not know: intermediate_generator.new_head",
        ),
        (lambda s: s.pop(DEC + "layers.1.selfattn.layer.wk.weight"), "missing"),
        (lambda s: s.update({DEC + "out.bias": torch.zeros(7)}), "wrong shape"),
        (lambda s: s.update({IG + "target_pos_emb.weights_1": s[IG + "target_pos_emb.weights.1"]}), "both"),
        (lambda s: s.pop(IG + "conv_to_embedding.1.weight"), "lacks intermediate_generator.conv_to_embedding"),
    ],
)
def test_refuses_checkpoints_that_do_not_fit(tmp_path, change, needle):
    state = authors_state_dict(SPEC, seed=3)
    change(state)
    with pytest.raises(ProCapError, match=needle):
        convert_authors_checkpoint(*_write(tmp_path, state))


def test_refuses_a_vocabulary_of_another_size(tmp_path):
    with pytest.raises(ProCapError, match="vocabulary of 30 words but the vocabulary file has 31"):
        convert_authors_checkpoint(*_write(tmp_path, authors_state_dict(SPEC), vocab=31))


def test_refuses_a_model_cfg_that_contradicts_the_weights(tmp_path):
    spec = dataclasses.replace(SPEC, hidden=48)
    state = authors_state_dict(spec)
    lying = dataclasses.replace(spec, dec_layers=2)  # model_cfg says 2 layers, the weights have 3
    write_authors_checkpoint(tmp_path / "m.chkpt", lying, state)
    write_vocab(tmp_path / "v.json", spec.vocab)
    with pytest.raises(ProCapError, match="num_hidden_layers = 2 but the weights say 3"):
        convert_authors_checkpoint(tmp_path / "m.chkpt", tmp_path / "v.json")
