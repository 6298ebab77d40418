"""`procap train --help` says what the command does (issue 41, item 4): no --init trains k = 2 from scratch (the
static pair needs --num-keyframes 0), and a new model's tokenizer is the one shipped in the package where it fits the
preset, else --vqgan is required, never a silent untrained one."""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from procap.commands.cli import build_parser
from procap.commands.cli_args import add_common_arguments, config_from_args
from procap.core.config import UNTRAINED_VQGAN
from procap.core.errors import ProCapError


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[command].format_help().split())


def _parse(stage: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, stage)
    return parser.parse_args(list(argv))


@pytest.fixture()
def data(tmp_path):
    from procap.data.synthetic import generate

    generate(tmp_path / "data", 12, size=16, seed=3, progress=False)
    return str(tmp_path / "data")


def test_train_help_says_what_omitting_init_trains():
    text = _help("train")
    assert "omit for the static-pair baseline" not in text
    assert "Without it a new model is trained from scratch with the preset's k = 2 procedure queries" in text
    assert "add --num-keyframes 0 for the static-pair baseline" in text
    assert "0 gives the static-pair baseline" in text


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_the_vqgan_help_names_the_real_default(command):
    text = _help(command)
    assert "the preset's untrained tokenizer" not in text
    assert "Default: the tokenizer shipped in the package where it fits the preset" in text
    assert "'untrained'" in text and "Not used with --init" in text


def test_train_has_no_warmup_steps_flag_it_would_ignore():
    assert "--warmup-steps" not in _help("train") and "--warmup-frac" in _help("train")
    assert "--warmup-steps" in _help("pretrain") and "--warmup-steps" in _help("vqgan")


@pytest.mark.parametrize("stage", ["train", "pretrain"])
def test_a_new_tiny_model_gets_the_shipped_tokenizer_and_says_so(tmp_path, data, caplog, stage):
    caplog.set_level(logging.INFO, logger="procap")  # the note is an INFO record (on stderr from the command line)
    from procap.train.tokenizer import embedded_tokenizer_path

    config = config_from_args(stage, _parse(stage, "--data", data, "--out", str(tmp_path / "r"), "--preset", "tiny"))
    assert config.vqgan == str(embedded_tokenizer_path())
    assert "no --vqgan given: using the tokenizer shipped in the package" in caplog.text


@pytest.mark.parametrize("stage", ["train", "pretrain"])
@pytest.mark.parametrize("preset", ["clevr", "levir"])
def test_a_preset_the_shipped_tokenizer_does_not_fit_needs_vqgan(tmp_path, data, stage, preset):
    args = _parse(stage, "--data", data, "--out", str(tmp_path / "r"), "--preset", preset)
    with pytest.raises(ProCapError, match=f"--vqgan is required with the {preset} preset") as info:
        config_from_args(stage, args)
    assert "\n" not in str(info.value) and "procap vqgan" in str(info.value)
    assert not (tmp_path / "r").exists()


def test_untrained_is_asked_for_by_name_and_survives_a_replay(tmp_path, data, caplog):
    caplog.set_level(logging.INFO, logger="procap")
    from procap.train.common import new_model

    args = _parse("train", "--data", data, "--out", str(tmp_path / "r"), "--preset", "clevr", "--vqgan", "untrained")
    config = config_from_args("train", args)
    assert config.vqgan == UNTRAINED_VQGAN and caplog.text.count("tokenizer") == 0
    (tmp_path / "c.json").write_text(json.dumps(config.replay_dict()))
    replayed = config_from_args("train", _parse("train", "--config", str(tmp_path / "c.json")))
    assert replayed.vqgan == UNTRAINED_VQGAN
    from procap.data import Vocabulary

    model = new_model("tiny", Vocabulary.build(["the cube moved"]), UNTRAINED_VQGAN)  # loads nothing
    assert model.config.name == "tiny"


def test_a_run_from_init_keeps_the_checkpoints_tokenizer(tmp_path, data):
    init = tmp_path / "s1.safetensors"
    init.write_bytes(b"x")
    config = config_from_args(
        "train", _parse("train", "--data", data, "--out", str(tmp_path / "r"), "--init", str(init))
    )
    assert config.vqgan is None
