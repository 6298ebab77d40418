"""procap.experiments.report on a small fake demo folder (no training): a self-contained, complete report.html."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
import torch
from PIL import Image

from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.data.vocab import Vocabulary
from procap.experiments.report import REPORT_NAME, build_report, curves_figure, curves_png, example_rows
from procap.loading.checkpoint import load_checkpoint, save_checkpoint
from procap.model.procap import ProCap
from procap.procedure import confidence_weights, sample_keyframes
from procap.viz.figures import MIN_TILE, imagine, strip_size
from tests.report_checks import FAKE_TYPES, LABELS, check_report_html, make_fake_demo


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random-weight k=2 ProCap saved as a stage-2 checkpoint."""
    torch.manual_seed(0)
    vocab = Vocabulary.build(["the small red cube moved", "no change", "a cube was added"])
    config = get_preset("tiny", vocab_size=len(vocab), enc_layers=1, dec_layers=1)
    path = tmp_path_factory.mktemp("report_ckpt") / "procap.safetensors"
    return save_checkpoint(path, ProCap(config).eval(), vocab, {"stage": "stage2"})


def test_report_is_self_contained_and_complete(tmp_path, checkpoint):
    folder = make_fake_demo(tmp_path / "demo", checkpoint)
    path = build_report(folder)
    assert path == folder / REPORT_NAME
    found = check_report_html(path, set(FAKE_TYPES))
    # curves + (before, after, imagined strip) for one example per change type (the second "move" is left out)
    assert len(found["images"]) == 1 + 3 * len(FAKE_TYPES)
    before, after, strip = found["images"][1:4]
    assert before == after == (64, 64)  # the sample's halves (shown at 128 px)
    assert strip[0] == strip_size(2, MIN_TILE, 0, 0)[0]  # before | 2 imagined frames | after
    text = found["text"]
    for label in LABELS:
        assert f"caption 0 of {label} <b>&" in text  # escaped in the file, the same text once parsed
    assert "caption 3 of" not in text and "reference 0 b" in text
    assert "stage-2 encoder" in text  # which head drew the frames
    assert "150.0" in text and "55.0" in text and "152.0" in text  # CIDEr and type accuracy (%) of the table
    assert "1234" in text  # the step of the checkpoint each model was scored with
    assert [p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"] == []


def test_report_without_checkpoint_says_so(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")
    found = check_report_html(build_report(folder), set(FAKE_TYPES))
    assert len(found["images"]) == 1 + 2 * len(FAKE_TYPES)
    assert "no ProCap checkpoint" in found["text"] and "no procedure cache" in found["text"]


def test_strip_is_what_imagine_draws_for_the_pair(tmp_path, checkpoint):
    """The embedded strip is pixel for pixel procap.viz.figures.imagine on the sample's before and after halves."""
    folder = make_fake_demo(tmp_path / "demo", checkpoint)
    build_report(folder)
    sources = _image_sources(folder / REPORT_NAME)
    embedded = Image.open(io.BytesIO(base64.b64decode(sources[3].split(",", 1)[1]))).convert("RGB")
    model, vocab, _ = load_checkpoint(checkpoint)
    with Image.open(folder / "samples" / "CLEVR_semantic_000000.png") as pair:
        pixels = torch.from_numpy(np.asarray(pair.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    expected = imagine(model, pixels[:, :, :64], pixels[:, :, 64:], vocab=vocab, stage="stage2").strip
    assert embedded.size == expected.size
    assert np.array_equal(np.asarray(embedded), np.asarray(expected))


def _image_sources(path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', path.read_text(encoding="utf-8"))


def test_stage1_section_draws_a_cached_training_pair(tmp_path):
    """With data/ and procedures/ (as the demo leaves them) the report shows a cached pair's explicit procedure."""
    from procap.data import load_split
    from procap.data.synthetic import generate
    from procap.procedure import CacheWriter, authors_key
    from procap.viz.figures import procedure_strip_size

    folder = make_fake_demo(tmp_path / "demo")
    generate(folder / "data", 6, size=32, seed=2, progress=False)
    moved = next(p for p in load_split("clevr-change", folder / "data", "train") if p.change_type == "move")
    gen = torch.Generator().manual_seed(0)
    frames = (torch.rand(9, 3, 32, 32, generator=gen) * 255).to(torch.uint8).numpy()
    s_bef, s_aft = torch.linspace(1, 0, 9), torch.rand(9, generator=gen)
    writer = CacheWriter(folder / "procedures")
    writer.write(*authors_key(moved.id, "clevr-change"), frames, s_bef.numpy(), s_aft.numpy(), pair_id=moved.id)
    writer.close()
    found = check_report_html(build_report(folder, imagine_procedures=False), set(FAKE_TYPES))
    assert len(found["images"]) == 1 + 2 * len(FAKE_TYPES) + 1
    assert found["images"][-1][0] == procedure_strip_size(9, MIN_TILE, 0, 0)[0]
    assert f"{moved.id} (move): confidence" in found["text"]
    keys = sample_keyframes(confidence_weights(s_bef, s_aft), 2)[1:-1].tolist()
    assert f"keyframes (top-2): P{keys[0]}, P{keys[1]}" in found["text"]


def test_empty_procedure_folder_leaves_a_note(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")
    (folder / "procedures").mkdir()
    (folder / "data").mkdir()
    found = check_report_html(build_report(folder, imagine_procedures=False), set(FAKE_TYPES))
    assert "holds no .h5 files" in found["text"] and "not drawn (imagine_procedures=False)" in found["text"]


def test_missing_or_broken_metrics_is_one_sentence(tmp_path):
    with pytest.raises(ProCapError, match="metrics.json does not exist"):
        build_report(tmp_path)
    (tmp_path / "metrics.json").write_text("{", encoding="utf-8")
    with pytest.raises(ProCapError, match="metrics.json is not valid JSON"):
        build_report(tmp_path)
    assert not (tmp_path / REPORT_NAME).exists()


def test_curves_read_every_log(tmp_path):
    assert curves_png(tmp_path) is None  # no logs at all
    folder = make_fake_demo(tmp_path / "demo")
    data = curves_png(folder)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG" and image.width > 3 * image.height / 2


def test_overlapping_loss_curves_stay_apart(tmp_path):
    """Losses within a few percent of each other stay apart: a log scale, and a line style and marker per model."""
    figure = curves_figure(make_fake_demo(tmp_path / "demo"))
    stage1, stage2, cider = figure.axes[:3]
    assert stage1.get_yscale() == stage2.get_yscale() == "log" and cider.get_yscale() == "linear"
    styles = {(line.get_linestyle(), line.get_marker(), line.get_markersize()) for line in stage2.lines}
    assert len(stage2.lines) == 4 and len(styles) == 4


def test_one_example_per_change_type():
    rows = [{"change_type": t, "id": str(i)} for i, t in enumerate(["move", "add", "move", None, "add"])]
    assert [r["id"] for r in example_rows(rows)] == ["0", "1", "3"]
