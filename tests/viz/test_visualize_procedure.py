"""procap.viz.figures.explicit_procedure and `procap procedure`: frames, confidence bars, outlined keyframes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.procedure import CacheWriter, ProcedureCache, authors_key, confidence_weights, sample_keyframes
from procap.viz.figures import (
    BAR_COLOUR,
    BAR_HEIGHT,
    GAP,
    KEY_COLOUR,
    MIN_TILE,
    caption_font,
    explicit_procedure,
    line_height,
    procedure_from_cache,
    procedure_strip_size,
)

L = 7


def _procedure(size: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(l + 2, 3, S, S) frames and similarities whose confidences differ from frame to frame."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.rand(L + 2, 3, size, size, generator=gen)
    s_bef = torch.linspace(1.0, 0.0, L + 2)
    s_aft = torch.rand(L + 2, generator=gen)
    return frames, s_bef, s_aft


def _layout(tile: int = MIN_TILE) -> tuple[int, int]:
    """(top of the tiles, top of the bars) in a strip without caption."""
    step = line_height(caption_font())
    return 2 * GAP + step, 3 * GAP + step + tile


def _x(index: int, tile: int = MIN_TILE) -> int:
    return GAP + index * (tile + GAP)


def test_shapes_scores_and_keyframes_match_the_sampler():
    frames, s_bef, s_aft = _procedure()
    result = explicit_procedure(frames, s_bef, s_aft, num_keyframes=2)
    weights = confidence_weights(s_bef, s_aft)
    assert result.frames.shape == (L + 2, 3, 16, 16) and torch.equal(result.frames, frames)
    assert result.weights.shape == (L,) and torch.allclose(result.weights, weights)
    assert torch.equal(result.keyframes, sample_keyframes(weights, 2)[1:-1])
    assert result.keyframes.tolist() == sorted(result.keyframes.tolist()) and len(set(result.keyframes.tolist())) == 2
    assert result.strip.size == procedure_strip_size(L + 2, MIN_TILE, 0, line_height(caption_font()))


def test_outlines_are_exactly_the_sampled_keyframes():
    frames, s_bef, s_aft = _procedure(seed=1)
    gen = torch.Generator().manual_seed(5)
    result = explicit_procedure(frames, s_bef, s_aft, num_keyframes=3, sampling="multinomial", generator=gen)
    assert torch.equal(result.keyframes, sample_keyframes(result.weights, 3, "multinomial", torch.manual_seed(5))[1:-1])
    pixels = np.asarray(result.strip)
    top, _ = _layout()
    outlined = [i for i in range(L + 2) if tuple(pixels[top + MIN_TILE // 2, _x(i) - 1]) == KEY_COLOUR]
    assert outlined == result.keyframes.tolist()


def test_bars_show_each_score():
    frames, s_bef, s_aft = _procedure(seed=2)
    result = explicit_procedure(frames, s_bef, s_aft, num_keyframes=1)
    pixels = np.asarray(result.strip)
    _, bar_top = _layout()
    row = pixels[bar_top + BAR_HEIGHT // 2]
    for i, weight in enumerate(result.weights.tolist(), start=1):
        filled = int((row[_x(i) : _x(i) + MIN_TILE] == BAR_COLOUR).all(axis=-1).sum())
        assert filled == round(weight * MIN_TILE), (i, weight)
    for end in (0, L + 1):  # before and after carry no bar
        assert not (row[_x(end) : _x(end) + MIN_TILE] == BAR_COLOUR).all(axis=-1).any()


def test_uint8_frames_caption_and_bad_shapes():
    frames, s_bef, s_aft = _procedure()
    as_bytes = (frames * 255).round().to(torch.uint8)
    result = explicit_procedure(as_bytes, s_bef, s_aft, num_keyframes=2, tile=32, caption="the cube moved")
    assert torch.allclose(result.frames, as_bytes.float() / 255)
    assert result.strip.size == procedure_strip_size(L + 2, 32, 1, line_height(caption_font()))
    with pytest.raises(ProCapError, match="similarities"):
        explicit_procedure(frames, s_bef[:-1], s_aft[:-1])
    with pytest.raises(ProCapError, match="frames must be"):
        explicit_procedure(frames[:, :2], s_bef, s_aft)


def _write_cache(folder, pair_id: str, frames: torch.Tensor, s_bef, s_aft) -> None:
    writer = CacheWriter(folder)
    group, key = authors_key(pair_id, "clevr-change")
    u8 = (frames * 255).round().to(torch.uint8).numpy()
    writer.write(group, key, u8, s_bef.numpy(), s_aft.numpy(), pair_id=pair_id)
    writer.close()


def test_from_cache_reads_what_prepare_stored(tmp_path):
    frames, s_bef, s_aft = _procedure()
    _write_cache(tmp_path, "CLEVR_semantic_000004.png", frames, s_bef, s_aft)
    cache = ProcedureCache(tmp_path)
    stored, got_bef, got_aft = procedure_from_cache(cache, "CLEVR_semantic_000004.png")
    assert stored.dtype == torch.uint8 and torch.equal(stored, (frames * 255).round().to(torch.uint8))
    assert torch.equal(got_bef, s_bef) and torch.equal(got_aft, s_aft)
    with pytest.raises(ProCapError, match="no entry for pair CLEVR_semantic_000009.png"):
        procedure_from_cache(cache, "CLEVR_semantic_000009.png")
    cache.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from procap.data import load_split
    from procap.data.synthetic import generate

    root = tmp_path_factory.mktemp("procedure_data")
    generate(root / "data", 6, size=32, seed=1, progress=False)
    return root / "data", load_split("clevr-change", root / "data", "train")[0]


def test_cli_draws_a_cached_pair(dataset, tmp_path, capsys):
    data, pair = dataset
    frames, s_bef, s_aft = _procedure(size=32, seed=3)
    _write_cache(tmp_path / "cache", pair.id, frames, s_bef, s_aft)
    out = tmp_path / "strip.png"
    argv = ["procedure", "--data", str(data), "--pair", pair.id, "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    keys = sample_keyframes(confidence_weights(s_bef, s_aft), 2)[1:-1].tolist()
    assert f"keyframes (topk, k=2): P{keys[0]} P{keys[1]}" in printed
    with Image.open(out) as image:
        width, _ = procedure_strip_size(L + 2, MIN_TILE, 0, 0)
        assert image.width == width


def test_cli_synthesizes_without_a_cache(dataset, tmp_path, capsys):
    from procap.model.vqgan import VQGAN
    from procap.train.vqgan_train import save_vqgan
    from tests.support import small_vqgan_config

    data, pair = dataset
    config = small_vqgan_config(resolution=32, ch_mult=(1, 2), attn_resolutions=(), embed_dim=8, n_embed=32)
    vqgan = save_vqgan(tmp_path / "vq.safetensors", VQGAN(config))
    out = tmp_path / "strip.png"
    argv = ["procedure", "--data", str(data), "--pair", pair.id, "--vqgan", str(vqgan), "--frames", "3"]
    assert main([*argv, "--out", str(out), "-k", "1"]) == 0
    assert "3 frames from synthesized now" in capsys.readouterr().out
    with Image.open(out) as image:
        assert image.width == procedure_strip_size(3 + 2, MIN_TILE, 0, 0)[0]


def test_cli_warns_when_the_scores_cannot_tell_frames_apart(dataset, tmp_path, capsys):
    """Equal similarities give equal confidences: top-k falls back to the earliest frames, and the CLI says so."""
    data, pair = dataset
    frames, _, _ = _procedure(size=32)
    ones = torch.ones(L + 2)
    _write_cache(tmp_path / "cache", pair.id, frames, ones, ones)
    argv = ["procedure", "--data", str(data), "--pair", pair.id, "--cache", str(tmp_path / "cache")]
    assert main([*argv, "--out", str(tmp_path / "s.png")]) == 0
    printed = capsys.readouterr().out
    assert "note: the scores are nearly equal" in printed and "keyframes (topk, k=2): P1 P2" in printed
