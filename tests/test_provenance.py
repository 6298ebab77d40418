"""What a file says about itself is checked where it is used (issue 39 E): the stage a checkpoint records, and
how much of the references a prediction file covers. (Config paths relative to the config file:
tests/train/test_run_folder.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.fast import Captioner
from procap.loading.checkpoint import check_can_caption, load_checkpoint, save_checkpoint, vocab_from_dict
from procap.model.procap import ProCap
from tests.support import small_training_config

WORDS = ["[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "the", "cube", "moved"]


@pytest.mark.parametrize("stage", ["stage1", "vqgan"])
def test_a_checkpoint_of_a_stage_that_cannot_caption_is_refused_by_the_library(tmp_path, stage):
    from procap.model.procap import ProCap

    vocab = vocab_from_dict({word: index for index, word in enumerate(WORDS)})
    model = ProCap(small_training_config(len(vocab)))
    path = save_checkpoint(tmp_path / "s.safetensors", model, vocab, {"stage": stage})
    with pytest.raises(ProCapError, match=f"checkpoint {path} records stage '{stage}'"):
        Captioner.from_checkpoint(path, device="cpu")


@pytest.mark.parametrize(
    "load",
    [
        lambda path: load_checkpoint(path)[0],
        lambda path: ProCap.from_pretrained(path),
    ],
    ids=["load_checkpoint", "ProCap.from_pretrained"],
)
def test_a_stage_one_model_loaded_by_hand_refuses_to_generate(tmp_path, load):
    """The stage check lives in the model: ``generate`` on weights whose file records stage 1 is refused, however
    they were loaded, before the images are encoded; the same weights recording stage 2 (or nothing) caption."""
    vocab = vocab_from_dict({word: index for index, word in enumerate(WORDS)})
    torch.manual_seed(0)
    model = ProCap(small_training_config(len(vocab)))
    size = model.config.image_size
    images = torch.rand(1, 3, size, size)
    stage1 = save_checkpoint(tmp_path / "stage1.safetensors", model, vocab, {"stage": "stage1"})
    loaded = load(stage1)
    with pytest.raises(ProCapError, match=f"checkpoint {stage1} records stage 'stage1'") as caught:
        loaded.generate(images, images)
    assert "\n" not in str(caught.value)
    with pytest.raises(ProCapError, match="records stage 'stage1'"):
        loaded.generate_from_memory(torch.zeros(1, 4, model.config.dec_dim))
    for extra in ({"stage": "stage2"}, {}):
        path = save_checkpoint(tmp_path / f"ok{len(extra)}.safetensors", model, vocab, extra)
        assert load(path).generate(images, images, max_len=3).shape == (1, 2)


def test_stage_two_and_unrecorded_stages_caption():
    check_can_caption({"extra": {"stage": "stage2"}}, "c.safetensors")
    check_can_caption({"extra": {}}, "c.safetensors")  # older files and conversions without a record
    check_can_caption({}, "c.safetensors")


def test_partial_predictions_need_allow_partial_and_the_report_states_the_coverage(tmp_path, capsys):
    refs = {f"p{i}": ["the cube moved"] for i in range(10)}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "pred.json").write_text(json.dumps({"p0": "the cube moved"}))
    argv = ["score", "--pred", str(tmp_path / "pred.json"), "--refs", str(tmp_path / "refs.json"), "--metrics", "bleu"]
    assert main(argv) == 2
    assert "covers 1 of the 10 ids" in capsys.readouterr().err
    assert main([*argv, "--allow-partial", "--out", str(tmp_path / "s.json")]) == 0
    assert "scored 1 of the 10 ids" in capsys.readouterr().err
    coverage = json.loads((tmp_path / "s.json").read_text())["coverage"]
    assert (coverage["scored"], coverage["references"]) == (1, 10)
