"""procap.experiments.report on a small fake demo folder (no training): a self-contained, complete report.html."""

from __future__ import annotations

import base64
import html
import io
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.data.vocab import Vocabulary
from procap.experiments.report import (
    ALIGN_CHANCE,
    LOG_SCALE_MIN_RATIO,
    REPORT_NAME,
    Stage1Outcome,
    about_html,
    budget_rows,
    build_report,
    curves_figure,
    curves_png,
    example_rows,
    imagined_note,
    log_ticks,
    stage1_outcome,
)
from procap.loading.checkpoint import load_checkpoint, save_checkpoint
from procap.model.procap import ProCap
from procap.procedure import confidence_weights, sample_keyframes
from procap.viz.figures import MIN_TILE, imagine, strip_size
from tests.report_checks import FAKE_TYPES, LABELS, check_report_html, fake_paired, make_fake_demo


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
    # which head drew the frames, and what the fake demo's stage 1 (alignment loss at chance) left it
    assert "stage 1's MSM head" in text and "alignment loss stayed at chance" in text and "skipped" not in text
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
    stage1, align, stage2, cider = figure.axes[:4]
    assert stage1.get_yscale() == stage2.get_yscale() == "log" and cider.get_yscale() == align.get_yscale() == "linear"
    styles = {(line.get_linestyle(), line.get_marker(), line.get_markersize()) for line in stage2.lines}
    assert len(stage2.lines) == 4 and len(styles) == 4


def test_one_example_per_change_type():
    rows = [{"change_type": t, "id": str(i)} for i, t in enumerate(["move", "add", "move", None, "add"])]
    assert [r["id"] for r in example_rows(rows)] == ["0", "1", "3"]


# ------------------------------------------------------------------------------ a report that explains itself


def _edit_summary(folder, **changes) -> None:
    """Overwrite keys of the fake demo's metrics.json."""
    path = folder / "metrics.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    summary.update(changes)
    path.write_text(json.dumps(summary), encoding="utf-8")


def _section(page: str, name: str) -> str:
    """The HTML from the heading with id ``name`` to the next h2."""
    start = page.index(f"id='{name}'")
    end = page.find("<h2", start)
    return page[start : end if end > 0 else len(page)]


def _text(fragment: str) -> str:
    """The text a browser shows for an HTML fragment: inline tags dropped, a line break a space."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment.replace("<br>", " "))))


def test_the_report_opens_with_what_was_trained_on_what_and_how_big(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")
    page = build_report(folder, imagine_procedures=False).read_text(encoding="utf-8")
    opening = re.search(r"<h1>[^<]*</h1>\s*<p id='about'>(.*?)</p>", page, flags=re.DOTALL)
    assert opening, "the first thing under the title is the opening paragraph"
    text = _text(opening.group(1))
    for label in LABELS:  # the four models of the 2 x 2, named
        assert label in text
    assert "800 scenes at 64 px; 1280 training and 160 validation pairs" in text  # the benchmark
    assert "viewpoint none: the camera stays put in change pairs" in text
    assert "1 seed scored on 6 test pairs (4 changes, 2 distractors)" in text  # how big the check is
    assert "one caption moves change accuracy by 16.7 points and type accuracy by 25.0" in text
    assert "quick demo is an end-to-end check that every step runs, not a benchmark" in text
    for term in ("change", "type", "object", "miss", "false pos.", "CIDEr"):  # how to read it
        assert f" {term} is" in text or f" {term} the share" in text or f" {term} scores" in text, term


def test_the_opening_of_a_full_demo_over_seeds_claims_no_toy_check(tmp_path):
    summary = _fake_summary(tmp_path)
    summary.update(quick=False, seeds=[0, 1, 2], viewpoint="distractor")
    text = _text(about_html(summary, 64))
    assert "3 seeds scored on 6 test pairs" in text and "means over the seeds" in text
    assert "not a benchmark" not in text
    assert "change pairs and distractors alike move the camera" in text


def _fake_summary(tmp_path) -> dict:
    """The fake demo's metrics.json, parsed."""
    return json.loads((make_fake_demo(tmp_path / "fake") / "metrics.json").read_text(encoding="utf-8"))


def test_the_budget_is_a_table_of_what_applied(tmp_path):
    """With the embedded tokenizer no tokenizer steps are listed (the fake budget's 123 vqgan_steps); a trained one
    lists them; nowhere is the budget dumped as JSON."""
    folder = make_fake_demo(tmp_path / "demo")
    page = build_report(folder, imagine_procedures=False).read_text(encoding="utf-8")
    budget = _text(_section(page, "budget"))
    assert "embedded (demo_tokenizer.safetensors): shipped with the package, not trained here" in budget
    assert "123" not in budget and "vqgan_steps" not in page and '"stage1_steps"' not in html.unescape(page)
    assert "10 steps, batch 8, lr 0.0005, on the first 24 training pairs" in budget
    assert "600 steps, batch 32, lr 0.001 after stage 1; 610 steps from a random encoder" in budget
    assert "the best by correctness on 40 validation pairs, checked every 300 steps" in budget
    rows = dict(budget_rows({**_fake_summary(tmp_path), "tokenizer": "trained"}))
    assert rows["tokenizer (VQGAN)"] == "trained here: 123 steps, batch 16, lr 0.001"


def _table_rows(page: str, section: str) -> list[list[str]]:
    """The text of every cell of the tables of ``section``, row by row."""
    return [
        [_text(cell).strip() for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", _section(page, section), flags=re.DOTALL)
    ]


def test_paired_table_shows_the_intervals_over_pairs_and_over_seeds(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")
    one_seed = _table_rows(build_report(folder, imagine_procedures=False).read_text(encoding="utf-8"), "paired")
    assert len(one_seed) == 1 + len(fake_paired())
    head = one_seed[0]
    assert "95 % over pairs" in head and "95 % over seeds" not in head  # one seed: no spread over seeds
    first = dict(zip(head, one_seed[1]))
    assert first["ProCap (k=2) minus"] == LABELS[3] and first["figure"] == "change"
    assert first["difference"] == "+1.0" and first["95 % over pairs"] == "[-19.0, +31.0]" and first["pairs"] == "6"
    assert first["ProCap %"] == "51.0" and first["other %"] == "50.0"
    assert dict(zip(head, one_seed[-1]))["ProCap (k=2) minus"] == "2x2 interaction"

    _edit_summary(folder, seeds=[0, 1], paired=fake_paired(seeds=2))
    two_seeds = _table_rows(build_report(folder, imagine_procedures=False).read_text(encoding="utf-8"), "paired")
    first = dict(zip(two_seeds[0], two_seeds[1]))
    assert first["95 % over pairs"] == "[-19.0, +31.0]" and first["95 % over seeds"] == "[-3.0, +6.0]"
    assert first["per seed"] == "+1.0 +2.0"


def test_every_per_type_figure_has_its_count_beside_it(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")
    page = build_report(folder, imagine_procedures=False).read_text(encoding="utf-8")
    rows = _table_rows(page, "per-type")
    head, body = rows[0], {row[0]: row for row in rows[1:]}
    assert head[:2] == ["change type", "pairs"]
    type_columns = [i for i, title in enumerate(head) if title.startswith("type acc.")]
    assert len(type_columns) == len(LABELS)
    for kind in ("move", "add"):
        assert body[kind][1] == "2"  # the pairs each CIDEr comes from
        assert [body[kind][i] for i in type_columns] == ["50.0 (1/2)"] * len(LABELS)
    assert [body["change"][i] for i in type_columns] == ["50.0 (2/4)"] * len(LABELS)  # every change pair
    assert {body["no_change"][i] for i in type_columns} == {"n/a"}  # a distractor has no type
    assert "<span class='few'>50.0 (1/2)</span>" in _section(page, "per-type")  # few pairs are marked


def _tick_labels(axis) -> list[str]:
    """The labels an axis shows: its ticks inside the drawn range, formatted, empty ones left out."""
    low, high = sorted(axis.get_view_interval())
    labels = []
    for locations, formatter in (
        (axis.get_majorticklocs(), axis.get_major_formatter()),
        (axis.get_minorticklocs(), axis.get_minor_formatter()),
    ):
        inside = [v for v in locations if low <= v <= high]
        formatter.set_locs(inside)
        labels += [formatter(v, i) for i, v in enumerate(inside)]
    return [label for label in labels if label.strip()]


def _write_log(path, losses) -> None:
    records = [{"step": 10 * (i + 1), "loss": loss, "align": 1.386} for i, loss in enumerate(losses)]
    path.write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")


def test_every_plot_is_labelled_with_enough_ticks(tmp_path):
    """A short stage 1's loss (7.0 to 8.4: one labelled tick on a log axis) is drawn linear; the stage-2 losses
    (a factor 20) on a log axis with round labels; every axis has at least three labelled ticks and a label."""
    folder = make_fake_demo(tmp_path / "demo")
    _write_log(folder / "stage1" / "log.jsonl", [8.4, 8.0, 7.6, 7.3, 7.1, 7.0, 7.05])
    figure = curves_figure(folder)
    figure.canvas.draw()
    stage1, align, stage2, cider = figure.axes[:4]
    assert stage1.get_yscale() == "linear" and stage2.get_yscale() == "log"
    assert _tick_labels(stage2.yaxis) == ["0.2", "0.5", "1", "2"]
    for axes in (stage1, align, stage2, cider):
        assert len(_tick_labels(axes.yaxis)) >= 3, (axes.get_title(), _tick_labels(axes.yaxis))
        assert len(_tick_labels(axes.xaxis)) >= 3, axes.get_title()
        assert axes.get_xlabel() == "step" and axes.get_ylabel(), axes.get_title()
    assert stage2.get_ylabel() == "loss (log scale)"
    assert any(line.get_ydata()[0] == ALIGN_CHANCE for line in align.lines)  # the alignment loss's chance level


def test_log_ticks_label_every_range_wide_enough_for_a_log_axis():
    for step in range(-300, 300):
        low = 10 ** (step / 100)
        ticks = log_ticks(low, LOG_SCALE_MIN_RATIO * low)
        assert len(ticks) >= 3, (low, ticks)
        assert all(low <= t <= LOG_SCALE_MIN_RATIO * low for t in ticks)
    assert log_ticks(0.24, 4.1) == [0.3, 0.5, 1.0, 2.0, 3.0]  # the roundest set that gives four


def _stage1_folder(tmp_path, init: str | None, align: float | None, config: bool = True):
    folder = tmp_path / "demo"
    (folder / "procap").mkdir(parents=True)
    (folder / "stage1").mkdir()
    if config:
        (folder / "procap" / "stage2_config.json").write_text(json.dumps({"init": init}), encoding="utf-8")
    if align is not None:
        records = [{"step": 10 * s, "align": 1.386, "align_acc": 0.5, "msm_acc": 0.02} for s in range(1, 31)]
        records += [{"step": 10 * s, "align": align, "align_acc": 0.7, "msm_acc": 0.09} for s in range(31, 41)]
        text = "\n".join(json.dumps(r) for r in records)
        (folder / "stage1" / "log.jsonl").write_text(text, encoding="utf-8")
    return folder


def test_the_imagined_note_says_what_stage_1_did(tmp_path):
    """The note follows the run folders: stage 1 at chance, stage 1 that learned, no stage 1, nothing recorded."""
    at_chance = stage1_outcome(_stage1_folder(tmp_path / "a", "stage1/stage1.safetensors", 1.385))
    assert at_chance.ran and at_chance.steps == 400 and at_chance.align_left_chance is False
    assert at_chance.align == pytest.approx(1.385) and at_chance.msm_accuracy == pytest.approx(0.09)
    note = imagined_note("stage2", at_chance)
    assert "Stage 1 ran (400 steps) but its alignment loss stayed at chance (mean alignment loss 1.385" in note
    assert "skipped" not in note and "not as a picture of the change" in note

    learned = stage1_outcome(_stage1_folder(tmp_path / "b", "stage1/stage1.safetensors", 1.0))
    assert learned.align_left_chance is True
    assert "Stage 1 ran (400 steps) and its alignment loss left chance (mean alignment loss 1.000" in imagined_note(
        "stage2", learned
    )

    without = stage1_outcome(_stage1_folder(tmp_path / "c", None, 1.0))
    assert without == Stage1Outcome(False)
    assert "started from a random encoder (no stage 1)" in imagined_note("stage2", without)

    unknown = stage1_outcome(_stage1_folder(tmp_path / "d", None, None, config=False))
    assert unknown == Stage1Outcome(None) and "stage-2 encoder" in imagined_note("stage2", unknown)
    assert imagined_note("stage1", at_chance).startswith("stage-1 encoder")  # a stage-1 checkpoint: its own head
