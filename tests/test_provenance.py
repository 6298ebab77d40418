"""What a file says about itself is checked where it is used (issue 39 E): the stage a checkpoint records, and
how much of the references a prediction file covers. (Config paths relative to the config file:
tests/train/test_run_folder.py.)"""

from __future__ import annotations

import json

import pytest

from procap.checkpoint import check_can_caption, save_checkpoint, vocab_from_dict
from procap.cli import main
from procap.errors import ProCapError
from procap.fast import Captioner
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
