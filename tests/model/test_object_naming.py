"""The tiny preset's object-naming departures: merged tokens, the signed joint difference, the change token.

Each is off in the paper presets; these tests pin what each computes (docs/model.md, "Naming the changed object").
"""

from __future__ import annotations

import pytest
import torch

from procap.core.config import PRESETS, Departures, get_preset
from procap.model.departures import (
    PixelCNN,
    WindowGlimpse,
    depth_to_space,
    joint_cells,
    pixel_cells,
    space_to_depth,
    window_cells,
    window_origin,
    window_pixels,
)
from procap.model.procap import ProCap
from tests.support import small_config, small_vqgan_config

torch.set_num_threads(1)


def naming_config(**overrides):
    """16 px, f2 small VQGAN (8 x 8 latents) with the object-naming departures on: 4 x 4 tokens of 2 x 2 cells."""
    base = {
        "vqgan": small_vqgan_config(ch_mult=(1, 2), attn_resolutions=()),
        "difference_mode": "joint",
        "token_merge": 2,
        "change_token": True,
        "change_pixels": True,
        "standardize_features": True,
        "difference_embedding": True,
    }
    return small_config(**{**base, **overrides})


def test_paper_presets_keep_the_paper_model():
    for name in ("clevr", "spot", "edit"):
        config = PRESETS[name]
        assert config.departures == Departures()  # every departure off
        assert config.grid_size == config.latent_size == 14
        assert config.memory_tokens == config.num_frames * 196
    tiny = get_preset("tiny")
    assert (tiny.latent_size, tiny.grid_size, tiny.tokens_per_frame, tiny.memory_tokens) == (
        16,
        4,
        16,
        4 * 16 + 1 + 5 * 5,
    )
    for name in ("clevr", "spot", "edit"):
        assert PRESETS[name].departures.pixel_cnn == PRESETS[name].departures.window_glimpse == 0
        assert not PRESETS[name].departures.difference_visible_ends


def test_checkpoints_from_before_the_leak_fix_keep_their_difference_embedding():
    from procap.core.config import ProCapConfig, config_from_dict

    tiny = get_preset("tiny")
    assert tiny.departures.difference_embedding and tiny.departures.difference_visible_ends  # on in the preset
    # written before the fix, and before the departures were grouped: every flag at the top level
    flat = {**tiny.to_dict(), **tiny.to_dict()["departures"]}
    del flat["departures"], flat["difference_visible_ends"]
    assert not config_from_dict(ProCapConfig, flat).departures.difference_visible_ends  # read as they were trained


def test_departures_are_one_group_written_grouped_and_read_in_either_form():
    from procap.core.config import ProCapConfig, config_from_dict

    tiny = get_preset("tiny")
    written = tiny.to_dict()
    assert "departures" in written and "token_merge" not in written  # the new form
    flat = {**written, **written["departures"]}
    del flat["departures"]
    assert config_from_dict(ProCapConfig, flat) == ProCapConfig.from_dict(flat) == tiny
    # a flat name overrides its flag, in presets and copies alike
    assert get_preset("tiny", token_merge=2).departures == tiny.replace(token_merge=2).departures
    assert tiny.replace(token_merge=2).departures.change_window == tiny.departures.change_window
    with pytest.raises(ValueError, match="departures.token_merge"):
        config_from_dict(ProCapConfig, {**written, "departures": {**written["departures"], "token_merge": 99}})
    with pytest.raises(ValueError, match="departures.change_token"):
        config_from_dict(ProCapConfig, {**written, "departures": {**written["departures"], "change_token": "yes"}})


def test_the_departures_table_of_the_model_docs_matches_the_code():
    import dataclasses
    import json
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "model.md").read_text(encoding="utf-8")
    section = text.split("## The departures in one place", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    # a default or tiny value is written as its JSON: `False`/`True` in the table read as Python's spelling
    documented = {
        cell[0].strip(" `"): tuple(
            json.loads(c.strip(" `").replace("True", "true").replace("False", "false")) for c in cell[1:]
        )
        for cell in rows
    }
    tiny = get_preset("tiny").departures
    in_code = {f.name: (f.default, getattr(tiny, f.name)) for f in dataclasses.fields(Departures)}
    assert documented == in_code


def test_space_to_depth_layout_and_inverse():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4)
    # merge 1 is the plain row-major token layout
    torch.testing.assert_close(space_to_depth(x, 1), x.flatten(2).transpose(1, 2))
    tokens = space_to_depth(x, 2)  # (2, 4, 12): token (gy, gx) holds cells (2gy + dy, 2gx + dx), order dy, dx, c
    assert tokens.shape == (2, 4, 12)
    for gy in range(2):
        for gx in range(2):
            expected = torch.stack([x[:, :, 2 * gy + dy, 2 * gx + dx] for dy in range(2) for dx in range(2)], 1)
            torch.testing.assert_close(tokens[:, gy * 2 + gx], expected.flatten(1))
    torch.testing.assert_close(depth_to_space(tokens, 2), x)


def test_joint_difference_is_signed_and_keeps_its_size():
    torch.manual_seed(0)
    before = torch.randn(2, 6, 8, 8)
    after = before.clone()
    after[:, :, 1, 2] += 3.0 * torch.randn(2, 6)  # one changed cell
    cells = joint_cells(before, after)
    difference = cells[:, 12:]
    magnitude = difference.square().mean(1)
    assert magnitude[:, 1, 2].min() > 100 * magnitude.flatten(1).sort(1).values[:, -2].max()  # unchanged cells ~0
    vqgan = small_vqgan_config(ch_mult=(1, 2), z_channels=6, embed_dim=6)
    model = ProCap(naming_config(vqgan=vqgan))
    forward = model.encoder.embed_difference(before, after)
    backward = model.encoder.embed_difference(after, before)
    assert forward.shape == (2, model.config.tokens_per_frame, model.config.enc_dim)
    assert (forward - backward).abs().max() > 1e-3  # add and drop no longer look alike
    absolute = ProCap(small_config(vqgan=small_vqgan_config(ch_mult=(1, 2), z_channels=6, embed_dim=6)))
    torch.testing.assert_close(
        absolute.encoder.embed_difference(before, after), absolute.encoder.embed_difference(after, before)
    )


def test_change_token_pools_the_changed_cells():
    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config).eval()
    z = config.vqgan.z_channels
    before = torch.randn(1, z, 8, 8)
    after = before.clone()
    after[:, :, 5, 3] = torch.randn(1, z) * 4
    pixels = torch.rand(2, 1, 3, 16, 16)  # before, after: 2 x 2 pixels per latent cell
    token = model.encoder.embed_change(before, after, pixels[0], pixels[1])
    assert token.shape == (1, 1, config.enc_dim)
    with torch.no_grad():
        model.encoder.change_temperature.fill_(1e4)  # a hard pick: the changed cell alone
        norm = model.encoder.feature_norm  # eval mode: the running statistics (0, 1 at the start)
        cell = joint_cells(norm(before), norm(after))[:, :, 5, 3]
        cell_pixels = [p[:, :, 10:12, 6:8].permute(0, 2, 3, 1).flatten(1) for p in pixels]  # (dy, dx, c) order
        expected = model.encoder.change_mlp(torch.cat([cell, *cell_pixels], 1)) + model.encoder.change_embedding
        torch.testing.assert_close(model.encoder.embed_change(before, after, pixels[0], pixels[1])[:, 0], expected)
        with pytest.raises(ValueError, match="pixels"):
            model.encoder.embed_change(before, after)


def test_memory_and_sequences_carry_the_change_token():
    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config).eval()
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    assert model.procedure_tokens(before, after).shape == (2, config.num_frames * 16 + 1, config.enc_dim)
    memory = model.memory(before, after)
    assert memory.shape == (2, config.memory_tokens, config.dec_dim) and config.memory_tokens == 3 * 16 + 1
    tokens = model.generate(before, after)
    assert tokens.shape == (2, config.max_caption_len - 1)


def test_merged_msm_targets_follow_the_heads_cells():
    config = naming_config()
    model = ProCap(config)
    latent = config.latent_size
    codes = torch.arange(2 * config.num_frames * latent * latent).view(2, -1) % config.vqgan.n_embed
    targets = model.msm_targets(codes)
    # token t of frame f predicts its 4 cells in (dy, dx) order
    grids = codes.view(2, config.num_frames, latent, latent)
    per_token = targets.view(2, config.num_frames, config.grid_size, config.grid_size, 2, 2)
    for dy in range(2):
        for dx in range(2):
            assert torch.equal(per_token[..., dy, dx], grids[:, :, dy::2, dx::2])


def test_stage1_with_merged_tokens_learns_and_reaches_every_cell():
    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config)
    frames = torch.rand(2, config.num_frames, 3, 16, 16)
    captions = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 8, 9, 2]])
    out = model.stage1_loss(frames, captions)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    assert model.encoder.change_mlp[0].weight.grad.abs().sum() > 0
    assert model.encoder.difference_mlp[0].weight.grad.abs().sum() > 0
    assert model.encoder.msm_head[1].weight.grad.shape[0] == 4 * config.vqgan.n_embed


def test_imagined_logits_are_back_on_the_latent_grid():
    from procap.viz.figures import procedure_logits

    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config).eval()
    before, after = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    logits = procedure_logits(model, before, after)
    assert logits.shape == (1, config.num_keyframes, config.latent_size**2, config.vqgan.n_embed)
    # the same numbers as the head's own output, re-laid from (token, dy, dx) to the latent grid's rows
    n = config.tokens_per_frame
    head = model.encoder.msm_head(model.encoder(model.procedure_tokens(before, after))[:, n : 2 * n])
    first = head.view(4, 4, 2, 2, -1)  # gy, gx, dy, dx, code
    grid = logits[0, 0].view(8, 8, -1)
    torch.testing.assert_close(grid[2 * 1 + 1, 2 * 3 + 0], first[1, 3, 1, 0])


@pytest.mark.parametrize("mode", ["absolute", "joint"])
def test_difference_modes_are_checked(mode):
    assert get_preset("tiny", difference_mode=mode).departures.difference_mode == mode
    with pytest.raises(ValueError, match="difference_mode"):
        get_preset("tiny", difference_mode="signed")


def test_memory_ablation_removes_exactly_the_named_parts():
    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config).eval()
    n, k = config.tokens_per_frame, config.num_keyframes
    parts = model.memory_parts()
    assert [parts[p].stop - parts[p].start for p in ("before", "queries", "after", "change")] == [n, k * n, n, 1]
    memory = torch.arange(config.memory_tokens, dtype=torch.float32).view(1, -1, 1).expand(2, -1, 3)
    without_queries = model.without_parts(memory, ("queries",))
    expected = torch.cat([memory[:, :n], memory[:, (k + 1) * n :]], dim=1)
    assert torch.equal(without_queries, expected)
    assert torch.equal(model.without_parts(memory, ("change",)), memory[:, :-1])
    assert model.without_parts(memory, ("queries", "change")).shape[1] == 2 * n
    with pytest.raises(Exception, match="unknown memory part"):
        model.without_parts(memory, ("frames",))
    # the decoder reads a shorter memory as it is: the ablated captions come out of the same greedy rule
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    full = model.memory(before, after)
    tokens = model.generate_from_memory(model.without_parts(full, ("queries",)))
    assert tokens.shape == (2, config.max_caption_len - 1)


def test_standardized_features_ignore_channel_offsets():
    # a long-trained tokenizer's channels sit ~2 standard deviations off zero; a per-channel standardisation
    # (running statistics, no affine) gives the same tokens with or without such offsets
    torch.manual_seed(0)
    config = naming_config()
    model = ProCap(config).train()
    z = config.vqgan.z_channels
    features = torch.randn(4, config.num_frames, z, 8, 8)
    offset = 5.0 * torch.randn(1, 1, z, 1, 1)
    plain = model.encoder.embed_visual(features)
    shifted = model.encoder.embed_visual(features + offset)
    torch.testing.assert_close(plain, shifted, atol=1e-4, rtol=1e-4)
    assert isinstance(model.encoder.feature_norm, torch.nn.BatchNorm2d) and not model.encoder.feature_norm.affine
    assert isinstance(ProCap(small_config()).encoder.feature_norm, torch.nn.Identity)  # off unless asked for


def test_change_window_is_centred_on_the_strongest_change_and_stays_on_the_grid():
    cells = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    magnitude = torch.zeros(2, 8, 8)
    magnitude[0, 3:6, 2:5] = 1.0  # a 3 x 3 object centred on (4, 3)
    magnitude[0, 0, 7] = 2.0  # one stronger cell alone: the 3 x 3 smoothing prefers the object
    magnitude[1, 6:8, 6:8] = 1.0  # an object in the corner: the window moves inside the grid
    window = window_cells(cells, *window_origin(magnitude, 3), 3)
    assert window.shape == (2, 9, 3)
    torch.testing.assert_close(window[0].view(3, 3, 3), cells[0, :, 3:6, 2:5].permute(1, 2, 0))
    torch.testing.assert_close(window[1].view(3, 3, 3), cells[1, :, 5:8, 5:8].permute(1, 2, 0))


def test_pixel_cells_hold_each_cells_pixels():
    images = torch.rand(2, 3, 8, 8)
    cells = pixel_cells(images, 4)  # 2 x 2 cells of 4 x 4 pixels
    assert cells.shape == (2, 3 * 16, 2, 2)
    torch.testing.assert_close(cells[:, :, 1, 0], images[:, :, 4:8, 0:4].permute(0, 2, 3, 1).flatten(1))


def test_window_tokens_embed_the_cells_around_the_change():
    torch.manual_seed(0)
    config = naming_config(change_window=3)
    model = ProCap(config).eval()
    z = config.vqgan.z_channels
    before = torch.randn(1, z, 8, 8)
    after = before.clone()
    after[:, :, 5, 3] = torch.randn(1, z) * 4
    pixels = torch.rand(2, 1, 3, 16, 16)
    with torch.no_grad():
        tokens = model.encoder.embed_change(before, after, pixels[0], pixels[1])
        assert tokens.shape == (1, 1 + 9, config.enc_dim)
        cells, _ = model.encoder.change_cells(before, after, pixels[0], pixels[1])
        window = cells[0, :, 4:7, 2:5].permute(1, 2, 0).reshape(9, -1)  # centred on the changed cell (5, 3)
        expected = model.encoder.window_mlp(window) + model.encoder.window_pos
        torch.testing.assert_close(tokens[0, 1:], expected)


def test_broadcast_adds_the_change_token_to_every_memory_token():
    torch.manual_seed(0)
    config = naming_config(change_window=2, change_broadcast=True)
    model = ProCap(config).eval()
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    encoded = {}
    model.encoder.register_forward_hook(lambda module, args, out: encoded.setdefault("out", out))
    with torch.no_grad():
        memory = model.memory(before, after)
        assert memory.shape == (2, config.memory_tokens, config.dec_dim) and config.memory_tokens == 3 * 16 + 1 + 4
        change = encoded["out"][:, model.memory_parts()["change"]]
        torch.testing.assert_close(memory, model.memory_mlp(encoded["out"] + change))
        parts = model.memory_parts()
        assert (parts["change"].stop - parts["change"].start, parts["window"].stop - parts["window"].start) == (1, 4)
        assert model.without_parts(memory, ("window",)).shape[1] == config.memory_tokens - 4
        assert model.generate(before, after).shape == (2, config.max_caption_len - 1)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"change_window": -1}, "change_window"),
        ({"change_window": 9}, "change_window"),
        ({"change_token": False, "change_window": 2}, "change_token"),
        ({"change_token": False, "change_broadcast": True}, "change_token"),
        ({"change_token": False, "pixel_cnn": 8}, "change_token"),
        ({"pixel_cnn": -1}, "pixel_cnn"),
        ({"change_window": 2, "window_glimpse": -1}, "window_glimpse"),
        ({"window_glimpse": 4}, "change_window"),
    ],
)
def test_change_window_and_broadcast_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        naming_config(**fields)


def test_pixel_cnn_gives_one_vector_per_latent_cell_from_that_cells_neighbourhood():
    torch.manual_seed(0)
    cnn = PixelCNN(8, 4)
    images = torch.rand(2, 3, 32, 32)
    features = cnn(images)
    assert features.shape == (2, 8, 8, 8)
    # receptive field: the cell and its neighbours two cells away; a pixel three cells off changes nothing
    moved = images.clone()
    moved[:, :, 0:4, 0:4] = 1 - moved[:, :, 0:4, 0:4]  # cell (0, 0)
    changed = (cnn(moved) - features).abs().amax(dim=(0, 1)) > 0
    reach = torch.zeros(8, 8, dtype=torch.bool)
    reach[:3, :3] = True
    assert torch.equal(changed, reach)
    # the first layer reads the [0, 1] image as [-1, 1]: its output is conv(2x - 1)
    first = cnn.layers[0]
    torch.testing.assert_close(
        first(images * 2 - 1), torch.nn.functional.conv2d(images * 2 - 1, first.weight, first.bias, stride=4)
    )


def test_change_cells_carry_the_cnn_features_of_both_images_and_their_difference():
    torch.manual_seed(0)
    config = naming_config(change_window=2, pixel_cnn=6)
    model = ProCap(config).eval()
    z = config.vqgan.z_channels
    before, after = torch.randn(2, z, 8, 8), torch.randn(2, z, 8, 8)
    before_pixels, after_pixels = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        cells, _ = model.encoder.change_cells(before, after, before_pixels, after_pixels)
        cnn_before, cnn_after = model.encoder.pixel_cnn(before_pixels), model.encoder.pixel_cnn(after_pixels)
    assert cells.shape == (2, 3 * z + 2 * 3 * 2 * 2 + 3 * 6, 8, 8)
    torch.testing.assert_close(cells[:, -18:], torch.cat([cnn_before, cnn_after, cnn_after - cnn_before], 1))
    with pytest.raises(ValueError, match="before_pixels"):
        model.encoder.change_cells(before, after)


def test_pixel_cnn_learns_with_the_caption_loss():
    torch.manual_seed(0)
    model = ProCap(naming_config(change_window=2, pixel_cnn=6))
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    captions = torch.randint(4, 20, (2, 8))
    model.stage2_loss(before, after, captions)["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.pixel_cnn.parameters())


def test_window_pixels_are_the_pixels_of_the_window_cells():
    images = torch.rand(3, 3, 32, 32)  # 8 x 8 cells of 4 x 4 pixels
    top, left = torch.tensor([0, 5, 2]), torch.tensor([3, 0, 5])
    crops = window_pixels(images, top, left, 3, 4)
    assert crops.shape == (3, 3, 12, 12)
    torch.testing.assert_close(crops[1], images[1, :, 20:32, 0:12])
    zero = torch.zeros(3, dtype=torch.long)  # the crop's own cells are the window's cells of the whole image
    torch.testing.assert_close(
        window_cells(pixel_cells(crops, 4), zero, zero, 3), window_cells(pixel_cells(images, 4), top, left, 3)
    )


def test_window_glimpse_reads_full_resolution_detail_of_its_cells_neighbourhood():
    torch.manual_seed(0)
    glimpse = WindowGlimpse(6, 4)
    before, after = torch.rand(2, 3, 20, 20), torch.rand(2, 3, 20, 20)
    features = glimpse(before, after)
    assert features.shape == (2, 25, 6)  # a vector per window cell, row-major
    # one pixel inside cell (0, 0) reaches that cell and its neighbours only (one cell away), not cell (0, 2)
    moved = after.clone()
    moved[:, :, 1, 1] = 1 - moved[:, :, 1, 1]
    changed = ((glimpse(before, moved) - features).abs().amax(dim=(0, 2)) > 0).view(5, 5)
    reach = torch.zeros(5, 5, dtype=torch.bool)
    reach[:2, :2] = True
    assert torch.equal(changed, reach)
    # a swap of before and after is seen (the difference is signed)
    assert not torch.allclose(glimpse(after, before), features)


def test_window_tokens_read_the_glimpse_of_the_window_pixels():
    torch.manual_seed(0)
    config = naming_config(change_window=3, window_glimpse=5)
    model = ProCap(config).eval()
    z = config.vqgan.z_channels
    before = torch.randn(1, z, 8, 8)
    after = before.clone()
    after[:, :, 5, 3] = torch.randn(1, z) * 4
    pixels = torch.rand(2, 1, 3, 16, 16)  # 2 x 2 pixels a cell
    with torch.no_grad():
        tokens = model.encoder.embed_change(before, after, pixels[0], pixels[1])
        cells, _ = model.encoder.change_cells(before, after, pixels[0], pixels[1])
        window = cells[0, :, 4:7, 2:5].permute(1, 2, 0).reshape(9, -1)  # centred on the changed cell (5, 3)
        glimpse = model.encoder.window_glimpse(pixels[0][:, :, 8:14, 4:10], pixels[1][:, :, 8:14, 4:10])[0]
        expected = model.encoder.window_mlp(torch.cat([window, glimpse], -1)) + model.encoder.window_pos
        torch.testing.assert_close(tokens[0, 1:], expected)
    model.train()
    captions = torch.randint(4, 20, (2, 8))
    model.stage2_loss(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16), captions)["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.window_glimpse.parameters())


@pytest.mark.parametrize(
    "fields",
    [{"change_pixels": True}, {"pixel_cnn": 4}, {"change_pixels": False, "change_window": 3, "window_glimpse": 4}],
)
def test_change_tokens_that_read_the_images_refuse_to_run_without_them(fields):
    model = ProCap(naming_config(**fields)).eval()
    z = model.config.vqgan.z_channels
    features = torch.randn(1, z, 8, 8)
    with pytest.raises(ValueError, match="pass before_pixels and after_pixels"):
        model.encoder.embed_change(features, features)
    pixels = torch.rand(1, 3, 16, 16)
    assert model.encoder.embed_change(features, features, pixels, pixels).shape[0] == 1
