"""The learned front end of the ``tiny`` preset: the image encoder, learned localisation, and stage 1's ends kept
from leaking through the difference and the change tokens (docs/model.md, "A learned front end")."""

from __future__ import annotations

import pytest
import torch

from procap.core.config import get_preset
from procap.kernels.masking import mask_from_params
from procap.model.departures import ImageEncoder, space_to_depth
from procap.model.procap import ProCap
from tests.model.test_object_naming import naming_config

torch.set_num_threads(1)

RANDOM_PATCH = 1  # MASKING_SCHEMES index


def front_end_config(**overrides):
    """``naming_config`` (16 px, 8 x 8 latent cells of 2 px, 4 x 4 tokens) with the learned front end on."""
    base = {"image_encoder": 6, "learned_localisation": True, "change_window": 3, "window_glimpse": 4}
    return naming_config(**{**base, **overrides})


def test_image_encoder_gives_one_vector_per_latent_cell_from_its_neighbourhood():
    torch.manual_seed(0)
    encoder = ImageEncoder(8, 4)
    images = torch.rand(2, 3, 32, 32)
    features = encoder(images)
    assert features.shape == (2, 8, 8, 8)
    # the last pixel of cell (3, 3) reaches the cells two away (two 3 x 3 convolutions on the grid), and through its
    # full-resolution neighbours in cells (3, 4), (4, 3) and (4, 4) one row and one column further
    moved = images.clone()
    moved[:, :, 15, 15] = 1 - moved[:, :, 15, 15]
    changed = (encoder(moved) - features).abs().amax(dim=(0, 1)) > 0
    reach = torch.zeros(8, 8, dtype=torch.bool)
    reach[1:7, 1:7] = True
    assert torch.equal(changed, reach)


def test_tokens_difference_and_change_cells_carry_the_learned_features():
    torch.manual_seed(0)
    config = front_end_config()
    model = ProCap(config).eval()
    z, c = config.vqgan.z_channels, config.departures.image_encoder
    frames = torch.rand(2, config.num_frames, 3, 16, 16)
    with torch.no_grad():
        features = model.frame_features(frames)
        learned = model.encoder.image_features(frames)
        assert learned.shape == (2, config.num_frames, c, 8, 8)
        # the tokens: the tokenizer's part plus a projection of the merged learned cells
        plain = model.encoder.visual_proj(
            model.encoder.visual_norm(
                space_to_depth(model.encoder.feature_norm(features.flatten(0, 1)), 2).reshape(2, -1, 4 * z)
            )
        )
        extra = model.encoder.image_proj(
            model.encoder.image_norm(space_to_depth(learned.flatten(0, 1), 2).reshape(2, -1, 4 * c))
        )
        torch.testing.assert_close(model.encoder.embed_visual(features, learned), plain + extra)
        cells, _ = model.encoder.change_cells(
            features[:, 0], features[:, -1], frames[:, 0], frames[:, -1], learned[:, 0], learned[:, -1]
        )
        ends = torch.cat([learned[:, 0], learned[:, -1], learned[:, -1] - learned[:, 0]], 1)
        torch.testing.assert_close(cells[:, -3 * c :], ends)
        # the difference reads them too: another learned after changes it
        one = model.encoder.embed_difference(features[:, 0], features[:, -1], learned[:, 0], learned[:, -1])
        two = model.encoder.embed_difference(features[:, 0], features[:, -1], learned[:, 0], learned[:, 0])
        assert not torch.allclose(one, two)
    for call in (
        lambda: model.encoder.embed_visual(features),
        lambda: model.encoder.embed_difference(features[:, 0], features[:, -1]),
        lambda: model.encoder.change_cells(features[:, 0], features[:, -1], frames[:, 0], frames[:, -1]),
    ):
        with pytest.raises(ValueError, match="image_features"):
            call()


def test_the_front_end_learns_in_both_stages():
    torch.manual_seed(0)
    config = front_end_config()
    model = ProCap(config)
    captions = torch.randint(4, 20, (3, 8))
    model.stage2_loss(torch.rand(3, 3, 16, 16), torch.rand(3, 3, 16, 16), captions)["loss"].backward()
    for module in (model.encoder.image_encoder, model.encoder.change_score, model.encoder.image_proj):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    model.zero_grad()
    frames = torch.rand(3, config.num_frames, 3, 16, 16)
    model.stage1_loss(frames, captions, generator=torch.Generator().manual_seed(0))["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.image_encoder.parameters())


def test_learned_localisation_moves_the_pooling_and_the_window():
    torch.manual_seed(0)
    config = front_end_config(window_glimpse=0)
    model = ProCap(config).eval()
    encoder = model.encoder
    z, c = config.vqgan.z_channels, config.departures.image_encoder
    before = torch.randn(1, z, 8, 8)
    after = before.clone()
    after[:, :, 1, 1] += 3.0  # the parameter-free rule's change is at cell (1, 1)
    pixels = torch.rand(1, 3, 16, 16)
    learned = torch.zeros(1, c, 8, 8)
    learned_after = learned.clone()
    learned_after[:, 0, 6, 5] = 1.0  # the learned features see it at cell (6, 5)
    last = encoder.change_score[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        cells, magnitude = encoder.change_cells(before, after, pixels, pixels, learned, learned_after)
        silent = encoder.embed_change(before, after, pixels, pixels, learned, learned_after)
        # a score that reads the learned difference's first channel, far larger than the parameter-free one
        first = encoder.change_score[0]
        first.weight.zero_()
        first.bias.zero_()
        first.weight[0, 3 * z + 2 * 3 * 4 + 2 * c] = 1.0
        last.weight[0, 0] = 1e3
        moved = encoder.embed_change(before, after, pixels, pixels, learned, learned_after)
    inputs = cells.flatten(2).transpose(1, 2)
    embedded = encoder.change_mlp(inputs)
    free = torch.softmax(encoder.change_temperature * magnitude.flatten(1), 1)
    with torch.no_grad():
        torch.testing.assert_close(silent[:, 0], free @ embedded[0] + encoder.change_embedding)
        # all the weight on cell (6, 5), and the 3 x 3 window around it
        torch.testing.assert_close(moved[:, 0], embedded[:, 6 * 8 + 5] + encoder.change_embedding)
        window = cells[0, :, 5:8, 4:7].permute(1, 2, 0).reshape(9, -1)
        torch.testing.assert_close(moved[0, 1:], encoder.window_mlp(window) + encoder.window_pos)


def test_stage1_ends_do_not_leak_through_the_difference_or_the_change_tokens():
    # Whatever is under a masked end's tokens (tokenizer features, learned features, pixels), every token that
    # is not masked reads the same: the difference embedding only where both ends are visible, the change
    # tokens only over cells visible in both, the image encoder only over visible pixels.
    torch.manual_seed(0)
    config = front_end_config(num_keyframes=0)
    model = ProCap(config).eval()
    b, grid = 2, config.grid_size
    frames = torch.rand(b, 2, 3, 16, 16)
    params = model.sample_mask_params(b, "cpu", torch.Generator().manual_seed(3))
    params.scheme.fill_(RANDOM_PATCH)
    params.patch_prob.fill_(0.4)
    mask = mask_from_params(params, 2, grid, grid)
    assert mask.any() and not mask.all()
    cell_hidden = mask.view(b, 2, grid, grid).repeat_interleave(2, 2).repeat_interleave(2, 3)  # (B, 2, 8, 8) cells
    pixel_hidden = cell_hidden.repeat_interleave(2, 2).repeat_interleave(2, 3)  # (B, 2, 16, 16)

    def inputs(frames, features):
        learned = model.encoder.image_features(model.hidden_pixels(frames, mask))
        visual, masked = model.apply_masking(model.encoder.embed_visual(features, learned), params)
        visual = model.with_difference(visual, features, visible=~masked, learned=learned)
        return model.with_change_token(visual, features, frames[:, 0], frames[:, -1], learned, visible=~masked)

    with torch.no_grad():
        features = model.frame_features(frames)
        reference = inputs(frames, features)
        other_frames = torch.where(pixel_hidden.unsqueeze(2), torch.rand_like(frames), frames)
        other_features = torch.where(cell_hidden.unsqueeze(2), torch.randn_like(features) * 3, features)
        torch.testing.assert_close(inputs(other_frames, other_features), reference)
        # the check can fail: the same change under a visible token is seen
        seen = features.clone()
        seen[:, -1] += torch.randn_like(seen[:, -1]) * 3
        assert not torch.allclose(inputs(frames, seen), reference)


def test_front_end_fields_are_checked():
    with pytest.raises(ValueError, match="pixel_cnn"):
        front_end_config(pixel_cnn=4)
    with pytest.raises(ValueError, match="image_encoder"):
        front_end_config(image_encoder=-1)
    with pytest.raises(ValueError, match="change_token"):
        front_end_config(change_token=False, change_window=0, window_glimpse=0, change_broadcast=False)


def test_tiny_carries_the_front_end_and_old_files_keep_theirs():
    tiny = get_preset("tiny").departures
    assert tiny.image_encoder > 0 and tiny.learned_localisation and tiny.pixel_cnn == 0
    # a file written before the front end names neither field: it was trained without them
    old = get_preset("tiny").to_dict()
    for name in ("image_encoder", "learned_localisation", "restart_front_end"):
        del old["departures"][name]
    old["departures"]["pixel_cnn"] = 32
    from procap.core.config import ProCapConfig

    read = ProCapConfig.from_dict(old).departures
    assert read.image_encoder == 0 and not read.learned_localisation and not read.restart_front_end
    assert get_preset("tiny").departures.restart_front_end and not get_preset("clevr").departures.restart_front_end


# What the encoder holds besides its front end: the stack, the tokenizer features' statistics, the caption side
# and the stage-1 heads (and the authors' prefix). Every attribute of the encoder with weights is one or the other.
NOT_FRONT_END = {"layers", "norm", "feature_norm", "text_embed", "text_pos", "align_token", "csy_token"}
NOT_FRONT_END |= {"msm_head", "align_head", "csy_head", "prefix"}


@pytest.mark.parametrize("mode", ["joint", "absolute"])
def test_every_weight_of_the_encoder_is_front_end_or_not(mode):
    """A new embedding module must be put on one side: restart_front_end would otherwise keep it silently."""
    from procap.model.departures import FRONT_END_MODULES

    changes = {} if mode == "joint" else {"difference_mode": "absolute"}
    encoder = ProCap(front_end_config(**changes)).encoder
    owners = {name.split(".")[0] for name, _ in [*encoder.named_parameters(), *encoder.named_buffers()]}
    assert owners - NOT_FRONT_END <= set(FRONT_END_MODULES)
    assert not set(FRONT_END_MODULES) & NOT_FRONT_END
    assert {"visual_proj", "image_encoder", "change_score", "window_glimpse"} <= owners


def test_restart_front_end_draws_a_new_models_front_end_and_keeps_the_rest():
    config = front_end_config()
    torch.manual_seed(0)
    model = ProCap(config)
    with torch.no_grad():  # stands for training: every weight moved away from any initialisation
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.rand_like(tensor) + 0.5)
    trained = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    random_state = torch.get_rng_state()
    restarted = model.restart_front_end(7)
    assert torch.equal(torch.get_rng_state(), random_state)
    torch.manual_seed(7)
    fresh = ProCap(config).state_dict()
    assert {"encoder.visual_proj.weight", "encoder.change_temperature", "encoder.window_pos"} <= set(restarted)
    assert any(name.startswith("encoder.image_encoder.") for name in restarted)
    for name, tensor in model.state_dict().items():
        expected = fresh[name] if name in restarted else trained[name]
        assert torch.equal(tensor, expected), name
    kept = set(trained) - set(restarted)
    assert {"encoder.layers.0.attn.q_proj.weight", "mask_embedding", "pos_frame", "decoder.embed.weight"} <= kept
    assert "encoder.feature_norm.running_mean" in kept
    # another seed draws another front end
    model.restart_front_end(8)
    assert not torch.equal(model.encoder.visual_proj.weight, fresh["encoder.visual_proj.weight"])
