"""procap.viz.figures.imagine and `procap imagine` on tiny random-weight models saved as real checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from procap.commands.cli import main
from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.data.vocab import Vocabulary
from procap.loading.checkpoint import load_checkpoint, save_checkpoint
from procap.model.departures import depth_to_space
from procap.model.procap import ProCap
from procap.viz.figures import (
    GAP,
    MIN_TILE,
    caption_font,
    choose_codes,
    imagine,
    line_height,
    procedure_logits,
    render_strip,
    strip_size,
    wrap_text,
)


def _vocab() -> Vocabulary:
    return Vocabulary.build(["the small red cube moved", "the large blue sphere changed to metal", "no change"])


def _model(vocab: Vocabulary, **overrides) -> ProCap:
    config = get_preset("tiny", vocab_size=len(vocab), enc_layers=1, dec_layers=1, **overrides)
    return ProCap(config).eval()


def _pair(size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.rand(3, size, size, generator=gen), torch.rand(3, size, size, generator=gen)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A k=2 tiny model saved as a stage-1 checkpoint, and a static (k=0) one."""
    folder = tmp_path_factory.mktemp("imagine")
    torch.manual_seed(0)
    vocab = _vocab()
    procap = save_checkpoint(folder / "procap.safetensors", _model(vocab), vocab, {"stage": "stage1"})
    static = save_checkpoint(folder / "static.safetensors", _model(vocab, num_keyframes=0), vocab, {"stage": "stage2"})
    before, after = _pair()
    paths = []
    for name, image in (("before.png", before), ("after.png", after)):
        array = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        Image.fromarray(array).save(folder / name)
        paths.append(folder / name)
    return {"procap": procap, "static": static, "before": paths[0], "after": paths[1], "folder": folder}


def test_shapes_and_codes_match_the_head(saved):
    model, vocab, _ = load_checkpoint(saved["procap"])
    model.trained_stage = "stage2"  # the same weights read as a stage-2 model, whose decoder may caption
    before, after = _pair()
    result = imagine(model, before, after, vocab=vocab, stage="stage2")
    # codes on the VQGAN's latent grid (a merged token predicts its m x m cells)
    k, n, size = model.config.num_keyframes, model.config.latent_size**2, model.config.image_size
    assert result.codes.shape == (k, n) and result.codes.dtype == torch.int64
    assert result.probabilities.shape == (k, n)
    assert result.frames.shape == (k, 3, size, size)
    assert 0.0 <= result.frames.min() and result.frames.max() <= 1.0
    assert "stage-2 encoder" in result.head
    # The codes are the argmax of the MSM head read at the query positions, and the frames their VQGAN decoding.
    logits = procedure_logits(model, before[None], after[None])[0]
    assert torch.equal(result.codes, logits.argmax(dim=-1))
    grid = model.config.latent_size
    assert torch.allclose(result.frames, model.vqgan.decode_codes(result.codes, grid, grid).clamp(0, 1), atol=1e-6)
    # the same caption the model generates on its own
    assert result.caption == model.caption_text(vocab, model.generate(before[None], after[None])[0].tolist())


def test_query_positions_depend_on_the_inputs(saved):
    model, _, _ = load_checkpoint(saved["procap"])
    before, after = _pair()
    first = procedure_logits(model, before[None], after[None])
    second = procedure_logits(model, after[None], before[None])
    assert not torch.allclose(first, second)


def test_caption_conditioning_uses_the_stage1_sequence(saved):
    model, vocab, _ = load_checkpoint(saved["procap"])
    before, after = _pair()
    text = "the small red cube moved"
    ids = torch.tensor([vocab.encode(text, max_len=model.config.max_caption_len)])
    conditioned = procedure_logits(model, before[None], after[None], ids)
    # the same positions read by hand from the stage-1 sequence
    enc, n, k = model.encoder, model.config.tokens_per_frame, model.config.num_keyframes
    out = enc(model.stage1_sequence(enc.embed_caption(ids), model.procedure_tokens(before[None], after[None])))
    start = ids.shape[1] + 2 + n
    heads = enc.msm_head(out[:, start : start + k * n]).view(k, n, -1)  # per merged token: its m x m cells' codes
    cells = depth_to_space(heads, model.departures.token_merge)  # (k, n_embed, h, w) on the latent grid
    expected = cells.flatten(2).transpose(1, 2).unsqueeze(0)
    assert torch.allclose(conditioned, expected, atol=1e-5)
    assert not torch.allclose(conditioned, procedure_logits(model, before[None], after[None]))
    result = imagine(model, before, after, vocab=vocab, condition=text, stage="stage1")
    assert result.caption == f"given caption: {text}" and "stage-1 encoder" in result.head
    assert torch.equal(result.codes, conditioned[0].argmax(-1))
    assert "decoder is untrained" in imagine(model, before, after, vocab=vocab, stage="stage1").caption
    with pytest.raises(ProCapError, match="vocabulary"):
        imagine(model, before, after, condition=text)


def test_deterministic_argmax_and_seeded_sampling(saved):
    model, vocab, _ = load_checkpoint(saved["procap"])
    before, after = _pair()
    a = imagine(model, before, after, vocab=vocab)
    b = imagine(model, before, after, vocab=vocab)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.frames, b.frames)
    assert a.strip.tobytes() == b.strip.tobytes()
    draw = [imagine(model, before, after, True, torch.Generator().manual_seed(s)).codes for s in (5, 5, 6)]
    assert torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])


def test_choose_codes_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 2.0, -30.0]]).expand(4000, 3)
    codes, _ = choose_codes(logits, sample=True, generator=torch.Generator().manual_seed(0))
    share = (codes == 1).float().mean().item()
    assert abs(share - torch.tensor([0.0, 2.0]).softmax(0)[1].item()) < 0.03 and not (codes == 2).any()
    top, top_probs = choose_codes(logits)
    assert (top == 1).all() and torch.allclose(top_probs, logits.softmax(-1)[:, 1])


def test_strip_size(saved):
    model, vocab, _ = load_checkpoint(saved["procap"])
    before, after = _pair()
    result = imagine(model, before, after, vocab=vocab)
    step = line_height(caption_font())
    k = model.config.num_keyframes
    lines = len(wrap_text(result.caption, caption_font(), (k + 2) * (MIN_TILE + GAP) - GAP))
    assert result.strip.size == strip_size(k, MIN_TILE, lines, step)
    assert result.strip.size[0] == 4 * MIN_TILE + 5 * GAP
    strip = render_strip(before, result.frames, after, "the small red cube moved", tile=50)
    assert strip.size == strip_size(k, 50, 1, step)
    # at tile = S the pixels are pasted unscaled: the second tile is exactly the first imagined frame
    strip = render_strip(before, result.frames, after, "", tile=64)
    x, y = GAP + 64 + GAP, 2 * GAP + step
    pasted = torch.from_numpy(np.array(strip.crop((x, y, x + 64, y + 64)))).permute(2, 0, 1)
    assert torch.equal(pasted, (result.frames[0] * 255).round().to(torch.uint8))
    assert strip.size == strip_size(k, 64, 0, step)


def test_long_caption_wraps():
    font = caption_font()
    lines = wrap_text("word " * 60, font, 200)
    assert len(lines) > 1 and all(font.getlength(line) <= 200 for line in lines)


def test_static_and_authors_checkpoints_are_refused(saved):
    model, vocab, _ = load_checkpoint(saved["static"])
    before, after = _pair()
    with pytest.raises(ProCapError, match="static-pair baseline"):
        imagine(model, before, after, vocab=vocab)
    authors = get_preset("tiny", vocab_size=len(vocab), authors={"enabled": True, "prefix_tokens": 26}, enc_layers=1)
    with pytest.raises(ProCapError, match="no MSM head"):
        imagine(ProCap(authors), before, after)


def test_wrong_image_shape_is_one_sentence(saved):
    model, _, _ = load_checkpoint(saved["procap"])
    with pytest.raises(ProCapError, match=r"before must be one image of shape \(3, 64, 64\)"):
        imagine(model, torch.rand(3, 32, 32), torch.rand(3, 64, 64))


@pytest.mark.parametrize("fill,message", [(float("nan"), "NaN or infinite"), (200.0, "divide 0-255")])
def test_non_finite_or_0_255_pixels_are_one_sentence(saved, fill, message):
    """NaN / infinite or 0-255 float pixels are refused with one sentence instead of imagining frames."""
    model, _, _ = load_checkpoint(saved["procap"])
    bad = torch.rand(3, 64, 64)
    bad[0, 0, 0] = fill
    with pytest.raises(ProCapError, match=f"after pixels .*{message}"):
        imagine(model, torch.rand(3, 64, 64), bad)


def test_cli_writes_the_strip(saved, capsys):
    out = saved["folder"] / "strips" / "strip.png"
    argv = ["imagine", "--ckpt", str(saved["procap"]), str(saved["before"]), str(saved["after"]), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "stage-1 encoder" in printed and "wrote" in printed
    with Image.open(out) as written:
        assert written.mode == "RGB" and written.width == 4 * MIN_TILE + 5 * GAP
    assert main([*argv[:-1], str(saved["folder"] / "sampled.png"), "--sample", "--seed", "3"]) == 0
    assert "sampled (seed 3)" in capsys.readouterr().out
    assert main([*argv[:-1], str(saved["folder"] / "given.png"), "--caption", "the small red cube moved"]) == 0
    assert "given caption: the small red cube moved" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("which", "extra", "message"),
    [
        ("static", [], "static-pair baseline"),
        ("procap", ["--out", "x.txt"], "--out x.txt must end in"),
        ("missing", [], "does not exist"),
    ],
)
def test_cli_errors_are_one_sentence_exit_2(saved, capsys, which, extra, message):
    ckpt = str(saved.get(which, saved["folder"] / "missing.safetensors"))
    out = saved["folder"] / f"{which}.png"
    argv = ["imagine", "--ckpt", ckpt, str(saved["before"]), str(saved["after"]), "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_a_stage1_checkpoint_shows_no_caption_even_when_the_caller_names_no_stage(saved):
    """The checkpoint's own record of its stage decides, as in ProCap.generate, which refuses it."""
    model, vocab, _ = load_checkpoint(saved["procap"])
    before, after = _pair()
    assert "decoder is untrained" in imagine(model, before, after, vocab=vocab, stage=None).caption
