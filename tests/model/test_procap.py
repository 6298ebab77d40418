"""The ProCap module: both stages end to end on a very small configuration."""

from __future__ import annotations

import pytest
import torch

from procap.core.config import MaskingConfig, get_preset
from procap.core.errors import ProCapError
from procap.kernels.masking import ENTIRE, IN_BLOCK, OUT_OF_BLOCK, RANDOM_PATCH, MaskParams, axial_positions
from procap.model.decoder import EOS_ID, PAD_ID, SUPPRESSED_IDS, suppress_specials
from procap.model.losses import caption_loss, msm_loss
from procap.model.procap import ProCap, count_parameters
from tests.support import random_captions, requires_cuda, small_config, small_vqgan_config


def _frames(batch: int, config, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, config.num_frames, 3, config.image_size, config.image_size, generator=g)


def _fixed_masks(model: ProCap, batch: int, scheme: int, patch_prob: float = 0.3) -> MaskParams:
    params = model.sample_mask_params(batch, "cpu", torch.Generator().manual_seed(5))
    params.scheme.fill_(scheme)
    params.patch_prob.fill_(patch_prob)
    return params


# -- construction -----------------------------------------------------------------------------------------------------
def test_paper_sizes_on_meta_device():
    with torch.device("meta"):
        model = ProCap(get_preset("clevr"))
    counts = count_parameters(model)
    assert set(counts) == {"vqgan", "encoder", "decoder", "total"}
    assert counts["total"] == counts["vqgan"] + counts["encoder"] + counts["decoder"]
    d, m = 768, 3072
    per_layer = 4 * (d * d + d) + (d * m + m) + (m * d + d) + 4 * d  # attention, MLP, two LayerNorms
    assert sum(p.numel() for p in model.encoder.layers.parameters()) == 12 * per_layer  # 85.05 M
    assert 85e6 < counts["encoder"] < 88e6  # plus embeddings, heads, e_m and positions
    assert model.pos_frame.shape == (4, 768) and model.pos_row.shape == (14, 768)
    assert model.encoder.msm_head[1].weight.shape == (1024, 768)


def test_vqgan_is_frozen_and_stays_in_eval(model):
    assert not any(p.requires_grad for p in model.vqgan.parameters())
    model.train()
    assert model.training and model.encoder.training and not model.vqgan.training
    assert not any(m.training for m in model.vqgan.modules())


# -- stage 1 -------------------------------------------------------------------------------------------------------------
def test_stage1_outputs_and_weighting():
    config = small_config(msm_weight=7.0, align_weight=0.5, csy_weight=0.5)
    model = ProCap(config)
    frames, captions = _frames(4, config), random_captions(4, 8, config.vocab_size)
    out = model.stage1_loss(frames, captions, generator=torch.Generator().manual_seed(0))
    assert {"loss", "msm", "align", "csy", "msm_acc", "align_acc", "csy_acc", "masked_fraction"} <= set(out)
    torch.testing.assert_close(out["loss"], 7.0 * out["msm"] + 0.5 * out["align"] + 0.5 * out["csy"])
    assert all(out[k].dim() == 0 and torch.isfinite(out[k]) for k in out)


def test_stage1_never_reads_device_values_on_the_host():
    # On the meta device every data-dependent host read (.item(), bool(), boolean-mask indexing) raises, so a stage-1
    # forward and backward that runs there waits on the GPU nowhere (the old `if changed.any()` and the MSM head's
    # boolean gathers did).
    config = get_preset("tiny")
    with torch.device("meta"):
        model = ProCap(config)
    t, s = config.num_frames, config.image_size
    frames = torch.rand(3, t, 3, s, s, device="meta")
    captions = torch.randint(8, config.vocab_size, (3, 9), device="meta")
    out = model.stage1_loss(frames, captions, generator=torch.Generator().manual_seed(0))
    out["loss"].backward()
    assert out["loss"].device.type == "meta"


def test_stage1_msm_reads_the_positive_rows(model, config):
    frames, captions = _frames(3, config), random_captions(3, 6, config.vocab_size)
    params = _fixed_masks(model, 3, RANDOM_PATCH)
    out = model.stage1_loss(frames, captions, mask_params=params)
    # The same computation by hand, with only the positive sequences (rows do not interact).
    visual, mask = model.apply_masking(model.embed_frames(frames), params)
    visual = model.with_difference(visual, model.frame_features(frames), visible=~mask)
    seq = model.stage1_sequence(model.encoder.embed_caption(captions), visual)
    logits = model.encoder.msm_head(model.encoder(seq)[:, 6 + 2 :])
    expected, _ = msm_loss(logits, model.frame_codes(frames), mask)
    torch.testing.assert_close(out["msm"], expected)
    torch.testing.assert_close(out["masked_fraction"], mask.float().mean())


def test_stage1_precomputed_codes_give_the_same_loss(model, config):
    frames, captions = _frames(2, config), random_captions(2, 8, config.vocab_size)
    params = _fixed_masks(model, 2, RANDOM_PATCH)
    a = model.stage1_loss(frames, captions, mask_params=params, generator=torch.Generator().manual_seed(1))
    b = model.stage1_loss(
        frames,
        captions,
        codes=model.frame_codes(frames),
        mask_params=params,
        generator=torch.Generator().manual_seed(1),
    )
    torch.testing.assert_close(a["loss"], b["loss"])


def test_stage1_nothing_masked_and_fully_masked(model, config):
    frames, captions = _frames(2, config), random_captions(2, 8, config.vocab_size)
    none = model.stage1_loss(frames, captions, mask_params=_fixed_masks(model, 2, RANDOM_PATCH, patch_prob=0.0))
    assert none["msm"].item() == 0.0 and none["masked_fraction"].item() == 0.0
    assert none["align"].item() > 0 and none["csy"].item() > 0
    none["loss"].backward()
    full = model.stage1_loss(frames, captions, mask_params=_fixed_masks(model, 2, ENTIRE))
    assert full["masked_fraction"].item() == 1.0 and full["msm"].item() > 0
    assert full["align"].item() == 0.0 and full["csy"].item() == 0.0  # nothing left to judge


def test_stage1_duplicate_captions_are_no_align_negatives(model, config):
    captions = random_captions(1, 8, config.vocab_size).expand(3, -1).contiguous()
    out = model.stage1_loss(_frames(3, config), captions, mask_params=_fixed_masks(model, 3, RANDOM_PATCH))
    assert out["align"].item() == 0.0 and out["csy"].item() > 0


def test_stage1_gradients_reach_encoder_not_vqgan_or_decoder(model, config):
    out = model.stage1_loss(
        _frames(2, config),
        random_captions(2, 8, config.vocab_size),
        mask_params=_fixed_masks(model, 2, RANDOM_PATCH, patch_prob=0.5),
    )
    out["loss"].backward()
    for name in (
        "mask_embedding",
        "pos_frame",
        "pos_row",
        "pos_col",
        "encoder.visual_proj.weight",
        "encoder.text_embed.weight",
        "encoder.align_token",
        "encoder.csy_token",
        "encoder.layers.0.attn.q_proj.weight",
        "encoder.msm_head.1.weight",
        "encoder.align_head.1.weight",
        "encoder.csy_head.1.weight",
    ):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert all(p.grad is None for p in model.vqgan.parameters())
    assert all(p.grad is None for p in model.decoder.parameters())


def test_stage1_rejects_wrong_frame_count(model, config):
    with pytest.raises(ProCapError, match=r"\(B, 3, 3, 16, 16\)"):
        model.stage1_loss(torch.rand(2, 4, 3, 16, 16), random_captions(2, 8, config.vocab_size))


# -- masking through the model ----------------------------------------------------------------------------------------
def _masks_by_scheme(model: ProCap, batch: int) -> tuple[MaskParams, torch.Tensor, torch.Tensor]:
    params = model.sample_mask_params(batch, "cpu", torch.Generator().manual_seed(11))
    x = torch.randn(batch, model.pos_frame.shape[0] * model.pos_row.shape[0] ** 2, model.config.enc_dim)
    out, mask = model.apply_masking(x, params)
    return params, mask, (x, out)


def test_masking_statistics_follow_the_paper_config():
    model = ProCap(small_config(image_size=32))  # 8x8 grid, T = 3
    params, mask, (x, out) = _masks_by_scheme(model, 2000)
    freq = torch.bincount(params.scheme, minlength=4).float() / 2000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.7, 0.1, 0.1]), atol=0.03, rtol=0)
    fraction = mask.float().mean(1)
    by = {s: fraction[params.scheme == s] for s in (ENTIRE, RANDOM_PATCH, IN_BLOCK, OUT_OF_BLOCK)}
    assert (by[ENTIRE] == 1).all()
    assert abs(by[RANDOM_PATCH].mean().item() - 0.35) < 0.01  # p ~ U(0.2, 0.5)
    assert abs(by[IN_BLOCK].mean().item() - 0.5) < 0.05  # area ratio ~ U(0.2, 0.8), rounded to the grid
    assert abs(by[OUT_OF_BLOCK].mean().item() - 0.5) < 0.05
    assert by[IN_BLOCK].min() >= 0.1 and by[IN_BLOCK].max() <= 0.9
    # Masked tokens become e_m + position, the others keep x + position.
    pos = axial_positions(model.pos_frame, model.pos_row, model.pos_col)
    expected = torch.where(mask[..., None], model.mask_embedding, x) + pos
    torch.testing.assert_close(out, expected)


def test_block_masks_are_the_same_rectangle_in_every_frame():
    model = ProCap(small_config(image_size=32))
    params, mask, _ = _masks_by_scheme(model, 300)
    grids = mask.view(300, 3, 8, 8)
    for b in torch.nonzero(params.scheme >= IN_BLOCK).flatten().tolist():
        grid = grids[b, 0] if params.scheme[b] == IN_BLOCK else ~grids[b, 0]
        assert (grids[b] == grids[b, :1]).all()
        rectangle = grid.any(1)[:, None] & grid.any(0)[None, :]
        assert torch.equal(grid, rectangle)
        height, width = params.block[b, 2:].tolist()
        assert int(grid.sum()) == height * width


def test_masking_follows_a_custom_config():
    # The authors' code: keep probability 0.2, i.e. ~80% masked under random-patch.
    model = ProCap(small_config(masking=MaskingConfig(scheme_probs=(0.0, 1.0, 0.0, 0.0), patch_prob_range=(0.8, 0.8))))
    params, mask, _ = _masks_by_scheme(model, 500)
    assert (params.scheme == RANDOM_PATCH).all()
    assert abs(mask.float().mean().item() - 0.8) < 0.01


# -- stage 2 ----------------------------------------------------------------------------------------------------------
def test_memory_shapes_implicit_and_explicit(model, config):
    frames = _frames(2, config)
    assert model.memory(frames[:, 0], frames[:, -1]).shape == (2, 3 * 16, 32)
    assert model.memory(None, None, frames=frames).shape == (2, 3 * 16, 32)
    with pytest.raises(ProCapError, match="frames must have shape"):
        model.memory(None, None, frames=frames[:, :2])
    with pytest.raises(ProCapError, match="before images"):
        model.memory(frames[:, 0, :, :8], frames[:, -1])


def test_procedure_queries_sit_between_before_and_after(config):
    model = ProCap(config.replace(difference_embedding=False))  # the paper's input, nothing added
    frames = _frames(2, config)
    tokens = model.procedure_tokens(frames[:, 0], frames[:, -1])
    visual = model.embed_frames(frames[:, [0, -1]])
    pos = model.positions()
    torch.testing.assert_close(tokens[:, :16], visual[:, :16] + pos[:16])
    torch.testing.assert_close(tokens[:, 16:32], (model.mask_embedding + pos[16:32]).expand(2, -1, -1))
    torch.testing.assert_close(tokens[:, 32:], visual[:, 16:] + pos[32:])


def test_difference_embedding_adds_the_change_at_each_position_to_every_frame(config):
    # the embedding as it was first built (checkpoints from before difference_visible_ends still run it)
    model = ProCap(config.replace(difference_embedding=True, difference_visible_ends=False))
    assert not hasattr(ProCap(config.replace(difference_embedding=False)).encoder, "difference_proj")
    frames = _frames(2, config)
    before, after = frames[:, 0], frames[:, -1]
    tokens = model.procedure_tokens(before, after)
    features = model.frame_features(torch.stack([before, after], dim=1))
    diff = model.encoder.difference_proj(
        model.encoder.difference_norm((features[:, 1] - features[:, 0]).abs().flatten(2).transpose(1, 2))
    )
    visual = model.embed_frames(frames[:, [0, -1]])
    pos = model.positions()
    torch.testing.assert_close(tokens[:, :16], visual[:, :16] + pos[:16] + diff)
    torch.testing.assert_close(tokens[:, 16:32], model.mask_embedding + pos[16:32] + diff)
    torch.testing.assert_close(tokens[:, 32:], visual[:, 16:] + pos[32:] + diff)
    # Swapping before and after changes the frames' order but not the change embedding.
    swapped = model.procedure_tokens(after, before)
    torch.testing.assert_close(swapped[:, 16:32], tokens[:, 16:32])


def _difference(model: ProCap, frames: torch.Tensor) -> torch.Tensor:
    features = model.frame_features(frames)
    return model.encoder.embed_difference(features[:, 0], features[:, -1])  # (B, n, D)


def test_difference_on_visible_ends_leaves_the_queries_alone(config):
    model = ProCap(config.replace(difference_embedding=True, difference_visible_ends=True))
    frames = _frames(2, config)
    before, after = frames[:, 0], frames[:, -1]
    tokens = model.procedure_tokens(before, after)
    diff, visual, pos = _difference(model, frames), model.embed_frames(frames[:, [0, -1]]), model.positions()
    torch.testing.assert_close(tokens[:, :16], visual[:, :16] + pos[:16] + diff)
    torch.testing.assert_close(tokens[:, 16:32], (model.mask_embedding + pos[16:32]).expand(2, -1, -1))  # no diff
    torch.testing.assert_close(tokens[:, 32:], visual[:, 16:] + pos[32:] + diff)
    # explicit frames: the middle frame is a frame, not an end, and gets no difference either
    explicit = model.with_difference(model.embed_frames(frames) + pos, model.frame_features(frames))
    torch.testing.assert_close(explicit[:, 16:32], model.embed_frames(frames)[:, 16:32] + pos[16:32])


def _stage1_visual(model: ProCap, frames: torch.Tensor, masks: MaskParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The positive rows' visual tokens of the stage-1 sequence and their mask."""
    captions = random_captions(frames.shape[0], 8, model.config.vocab_size)
    seq, mask = model._stage1_sequences(frames, captions, masks, torch.Generator().manual_seed(1))
    start = 2 + captions.shape[1]  # [e_align] [caption] [e_csy] [visual]
    return seq[: frames.shape[0], start : start + mask.shape[1]], mask


@pytest.mark.parametrize("visible_ends", [False, True])
def test_a_masked_end_is_unreadable_only_with_the_difference_on_visible_ends(config, visible_ends):
    model = ProCap(config.replace(difference_embedding=True, difference_visible_ends=visible_ends)).eval()
    masks = _fixed_masks(model, 2, RANDOM_PATCH, patch_prob=0.5)
    frames = _frames(2, config, seed=3)
    other = frames.clone()
    other[:, -1] = torch.rand(other[:, -1].shape, generator=torch.Generator().manual_seed(9))  # another after image
    tokens, mask = _stage1_visual(model, frames, masks)
    tokens_other, mask_other = _stage1_visual(model, other, masks)
    assert torch.equal(mask, mask_other) and mask.any() and (~mask).any()
    masked = mask.unsqueeze(-1).expand_as(tokens)
    if visible_ends:
        # a masked token is e_m plus its position whatever the images: nothing of the after image reaches it
        torch.testing.assert_close(tokens[masked], tokens_other[masked], rtol=0, atol=0)
        # a visible middle-frame token carries its own frame alone (the difference stays on the ends)
        n = model.config.tokens_per_frame
        diff = _difference(model, frames)
        plain = ProCap(config.replace(difference_embedding=True, difference_visible_ends=False))
        plain.load_state_dict(model.state_dict())
        reference, _ = _stage1_visual(plain.eval(), frames, masks)
        visible_middle = (~mask[:, n : 2 * n]).unsqueeze(-1)
        torch.testing.assert_close(
            tokens[:, n : 2 * n] * visible_middle, (reference[:, n : 2 * n] - diff) * visible_middle
        )
    else:  # the leak the flag closes: masked tokens differ with the (hidden) after image
        assert not torch.equal(tokens[masked], tokens_other[masked])


def test_width_scaled_init_is_the_paper_init_at_paper_width():
    from procap.core.config import get_preset
    from procap.model.procap import init_stds

    assert init_stds(get_preset("clevr")) == (0.02, 0.02)
    assert init_stds(get_preset("clevr", width_scaled_init=True)) == pytest.approx((0.02, 0.02))
    enc, dec = init_stds(get_preset("tiny"))
    assert enc == pytest.approx(0.02 * 6**0.5) and dec == pytest.approx(0.04)


def test_stage2_loss_is_teacher_forced_cross_entropy(model, config):
    frames, captions = _frames(2, config), random_captions(2, 8, config.vocab_size)
    model.eval()
    out = model.stage2_loss(frames[:, 0], frames[:, -1], captions)
    logits = model.decoder(captions[:, :-1], model.memory(frames[:, 0], frames[:, -1]))
    expected, _ = caption_loss(logits, captions[:, 1:], PAD_ID, config.label_smoothing)
    torch.testing.assert_close(out["loss"], expected)
    model.train()
    out = model.stage2_loss(frames[:, 0], frames[:, -1], captions)
    out["loss"].backward()
    for name in (
        "decoder.embed.weight",
        "decoder.layers.0.cross_attn.k_proj.weight",
        "memory_mlp.0.weight",
        "encoder.layers.0.mlp.fc1.weight",
        "mask_embedding",
        "pos_frame",
        "encoder.visual_proj.weight",
    ):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    for name in ("encoder.msm_head.1.weight", "encoder.text_embed.weight", "encoder.align_token"):
        assert model.get_parameter(name).grad is None, name
    assert all(p.grad is None for p in model.vqgan.parameters())


def test_static_pair_baseline_k0():
    config = small_config(num_keyframes=0)
    model = ProCap(config)
    frames = _frames(2, config)
    assert frames.shape[1] == 2
    assert model.memory(frames[:, 0], frames[:, 1]).shape == (2, 2 * 16, 32)
    model.stage2_loss(frames[:, 0], frames[:, 1], random_captions(2, 8, config.vocab_size))["loss"].backward()
    assert model.generate(frames[:, 0], frames[:, 1], max_len=5).shape == (2, 4)
    out = model.stage1_loss(frames, random_captions(2, 8, config.vocab_size))
    assert torch.isfinite(out["loss"])


def test_generate_is_greedy_without_specials_and_pads_after_eos(config):
    model = ProCap(config.replace(width_scaled_init=False))  # the EOS scaling below is sized for std 0.02
    with torch.no_grad():  # make EOS likely somewhere so the PAD rule is exercised
        model.decoder.embed.weight[EOS_ID] *= 12.0
    frames = _frames(6, config)
    model.train()
    tokens = model.generate(frames[:, 0], frames[:, -1])
    assert model.training  # mode restored
    assert tokens.shape == (6, 7) and tokens.dtype == torch.long
    assert not torch.isin(tokens, torch.tensor(SUPPRESSED_IDS[1:])).any()  # only PAD (after EOS) may appear
    ended = (tokens == EOS_ID).cumsum(1) > 0
    after_eos = torch.cat([torch.zeros(6, 1, dtype=torch.bool), ended[:, :-1]], dim=1)
    assert torch.equal(tokens == PAD_ID, after_eos)
    assert after_eos.any()  # some caption ended early (the EOS row was scaled up above)
    # The oracle agrees with teacher-forced argmax on its own output, up to EOS.
    model.eval()
    memory = model.memory(frames[:, 0], frames[:, -1])
    prefix = torch.cat([torch.full((6, 1), 4), tokens], dim=1)
    argmax = suppress_specials(model.decoder(prefix[:, :-1], memory)).argmax(-1)
    assert torch.equal(argmax[~after_eos], tokens[~after_eos])
    assert torch.equal(model.generate_from_memory(memory), tokens)
    assert model.generate(None, None, frames=frames).shape == tokens.shape  # explicit procedure captioning
    with pytest.raises(ProCapError, match="max_len"):
        model.generate(frames[:, 0], frames[:, -1], max_len=9)


def test_paper_geometry_224px_gives_196_tokens_per_frame():
    # The paper's f16 layout at reduced width: 224 px -> 14x14 = 196 tokens per frame, (k + 2) * 196 memory rows.
    config = small_config(
        image_size=224,
        num_keyframes=2,
        vqgan=small_vqgan_config(resolution=224, ch_mult=(1, 1, 2, 2, 4), attn_resolutions=(16,), z_channels=32),
    )
    model = ProCap(config)
    assert config.tokens_per_frame == 196 and model.pos_row.shape[0] == 14
    image = torch.rand(1, 3, 224, 224)
    assert model.memory(image, image).shape == (1, 4 * 196, 32)


@requires_cuda
def test_cuda_bf16_autocast_both_stages(config):
    model = ProCap(config).cuda()
    frames = _frames(2, config).cuda()
    captions = random_captions(2, 8, config.vocab_size).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        stage1 = model.stage1_loss(frames, captions)
        stage2 = model.stage2_loss(frames[:, 0], frames[:, -1], captions)
    assert torch.isfinite(stage1["loss"]) and torch.isfinite(stage2["loss"])
    (stage1["loss"] + stage2["loss"]).backward()
    assert all(p.grad is None for p in model.vqgan.parameters())
    tokens = model.generate(frames[:, 0], frames[:, -1])
    assert tokens.shape == (2, 7) and tokens.device.type == "cuda"
    assert not torch.isin(tokens.cpu(), torch.tensor(SUPPRESSED_IDS[1:])).any()


def test_negative_features_reencode_only_changed_frames(model, config):
    frames = _frames(3, config)
    negatives = frames.clone()
    negatives[0, 1] = torch.rand(3, 16, 16)  # one new frame
    negatives[2] = negatives[2].flip(0)  # a shuffle: every position changes
    changed = torch.zeros(frames.shape[:2], dtype=torch.bool)  # what consistency_negatives reports, on the CPU
    changed[0, 1] = True
    changed[2] = True
    features = model.frame_features(frames)
    got = model._negative_features(negatives, changed, features)
    torch.testing.assert_close(got, model.frame_features(negatives), atol=1e-5, rtol=1e-5)
    assert torch.equal(got[1], features[1])
