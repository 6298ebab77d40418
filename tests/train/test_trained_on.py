"""Checkpoints record what they were trained on (``trained_on``): training writes it, loading, ``save_pretrained`` /
``from_pretrained`` keep it, the model card shows it, and a checkpoint from before the record loads as unknown."""

from __future__ import annotations

import pytest

from procap.data.domain import TRAINED_ON, read_domain, training_domain
from procap.loading.checkpoint import load_checkpoint, read_checkpoint_metadata, save_checkpoint
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from tests.support import small_training_config


@pytest.fixture
def small_models(monkeypatch):
    """Training builds the 16 px test model instead of the ``tiny`` preset's."""
    from procap.train import stage1

    def build(preset, vocab, vqgan_path, **overrides):
        return ProCap(small_training_config(len(vocab), **overrides))

    monkeypatch.setattr(stage1, "new_model", build)


def _expected(clevr_root) -> dict:
    return {
        "dataset": "clevr-change",
        "synthetic": True,
        "title": "synthetic CLEVR-Change (procap synth)",
        "data": str(clevr_root.resolve()),
        "image_size": 16,
        "source_image_size": [16, 16],
        "preset": "tiny",
    }


def test_training_records_the_data_in_every_checkpoint(tmp_path, small_models, clevr_root, train_pairs, vocab):
    from procap.train.stage1 import pretrain
    from procap.train.stage2 import train

    # stage 1 is handed its pairs without --data (as the demo's workers may be): the folder is found from them
    stage1 = pretrain(
        TrainConfig(stage="pretrain", out=str(tmp_path / "s1"), steps=1, batch_size=4, progress=False),
        pairs=train_pairs,
        vocab=vocab,
    )
    assert read_checkpoint_metadata(stage1)["extra"][TRAINED_ON] == _expected(clevr_root)
    cfg = TrainConfig(
        stage="train",
        data=str(clevr_root),
        out=str(tmp_path / "s2"),
        init=str(stage1),
        steps=1,
        batch_size=4,
        val_pairs=2,
        progress=False,
    )
    best = train(cfg, pairs=train_pairs)
    for path in (best, tmp_path / "s2" / "last.safetensors"):
        assert read_checkpoint_metadata(path)["extra"][TRAINED_ON] == _expected(clevr_root), path
    model, _, metadata = load_checkpoint(best)
    assert read_domain(model.pretrained_info) == _expected(clevr_root) == read_domain(metadata["extra"])


def test_a_real_benchmark_is_not_called_synthetic(tmp_path, train_pairs):
    """Without ``scenes.json`` beside the images the data is a real benchmark (``synthetic`` False)."""
    import shutil

    root = tmp_path / "clevr_change"
    (root / "images").mkdir(parents=True)
    shutil.copyfile(train_pairs[0].before_path, root / "images" / train_pairs[0].before_path.name)
    pair = type(train_pairs[0])(
        train_pairs[0].id, root / "images" / train_pairs[0].before_path.name, train_pairs[0].after_path, ["x"]
    )
    record = training_domain("clevr-change", [pair], 224, "clevr", root)
    assert (record["synthetic"], record["title"], record["source_image_size"]) == (False, "CLEVR-Change", [16, 16])
    # handed pairs without a folder, only a synthetic benchmark is recognised; a real one's folder stays unknown
    assert training_domain("clevr-change", [pair], 224, "clevr")["data"] is None


def test_save_pretrained_keeps_the_record_and_the_card_shows_it(tmp_path, model, vocab, clevr_root, train_pairs):
    record = training_domain("clevr-change", train_pairs, 16, "tiny", clevr_root)
    save_checkpoint(tmp_path / "best.safetensors", model, vocab, {"stage": "stage2", TRAINED_ON: record})
    loaded, loaded_vocab, _ = load_checkpoint(tmp_path / "best.safetensors")
    folder = loaded.save_pretrained(tmp_path / "pretrained", loaded_vocab)  # nothing passed: the record travels

    again = ProCap.from_pretrained(folder)
    assert read_domain(again.pretrained_info) == _expected(clevr_root)
    card = (folder / "README.md").read_text()
    assert "CLEVR-Change (procap's loader `clevr-change`)." in card  # the card's dataset defaults to the record's
    for row in (
        "| dataset | synthetic CLEVR-Change (procap synth) |",
        "| synthetic scenes | yes (`procap synth`) |",
        f"| dataset folder | `{clevr_root.name}` |",
        "| training images | 16 x 16 px |",
        "| model input | 16 px |",
        "| preset | `tiny` |",
    ):
        assert row in card, row
    assert str(clevr_root) not in card  # the full path stays in the metadata, off the public page
    assert "OutOfDomainWarning" in card


def test_a_checkpoint_without_the_record_loads_as_unknown(tmp_path, model, vocab):
    save_checkpoint(tmp_path / "old.safetensors", model, vocab, {"stage": "stage2", "step": 3})
    loaded, loaded_vocab, metadata = load_checkpoint(tmp_path / "old.safetensors")
    assert TRAINED_ON not in metadata["extra"] and read_domain(loaded.pretrained_info) is None
    folder = loaded.save_pretrained(tmp_path / "pretrained", loaded_vocab)
    card = (folder / "README.md").read_text()
    assert "## Training data\n\nNot recorded.\n" in card and "| trained on |" not in card


@pytest.mark.parametrize(
    "record",
    ["clevr", [1, 2], {"source_image_size": "64", "image_size": True, "synthetic": "yes", "preset": 3}],
)
def test_a_malformed_record_says_less_never_fails(record):
    read = read_domain({TRAINED_ON: record})
    assert read is None or (read["source_image_size"], read["image_size"], read["synthetic"]) == (None, None, None)
