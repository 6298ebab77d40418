"""Every subcommand's help is true to what the command does: defaults said where there is one, `--ckpt` as every
command reads it, `--tile`'s range and default those of the code behind them."""

from __future__ import annotations

import argparse
import re

import pytest
from PIL import Image

from procap.commands.cli import build_parser, main
from procap.commands.hub_args import CHECKPOINT_HELP
from procap.data.datasets import DEFAULT_DATASET
from procap.train.config import TrainConfig


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _option(command: str, flag: str) -> argparse.Action:
    return next(a for a in _commands()[command]._actions if flag in a.option_strings)


def test_every_option_with_a_default_says_it():
    """A default argparse holds (not None, not a switch's False) is written in the help, as "(default X)"."""
    silent = [
        f"{name} {action.option_strings[0]}"
        for name, command in _commands().items()
        for action in command._actions
        if action.option_strings
        and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert silent == []


@pytest.mark.parametrize("command", ["caption", "evaluate", "imagine", "profile"])
def test_ckpt_help_names_everything_ckpt_takes(command):
    """Folders and hf:// work in every command that takes --ckpt (procap.core.hub_files.resolve_checkpoint)."""
    text = _option(command, "--ckpt").help
    assert text.startswith(CHECKPOINT_HELP)
    assert all(word in text for word in (".safetensors file", "pretrained folder", "hf://owner/repo"))


def test_evaluate_says_its_dataset_default():
    action = _option("evaluate", "--dataset")
    assert action.default == DEFAULT_DATASET and f"(default {DEFAULT_DATASET})" in action.help


@pytest.mark.parametrize("command", ["imagine", "procedure"])
def test_tile_help_is_the_code_s_range_and_default(command, checkpoint, tmp_path, capsys):
    from procap.viz.figures import MIN_TILE

    text = _option(command, "--tile").help
    low, high = (int(v) for v in re.search(r"(\d+) to (\d+) pixels", text).groups())
    assert f"at least {MIN_TILE})" in text
    (tmp_path / "data").mkdir()
    image = tmp_path / "data" / "a.png"
    Image.new("RGB", (32, 32)).save(image)
    # every other argument usable, so that whatever order the checks run in, --tile is the one refused
    needs = {
        "imagine": [str(image), str(image), "--ckpt", str(checkpoint)],
        "procedure": ["--data", str(tmp_path / "data"), "--pair", "x", "--vqgan", str(checkpoint)],
    }
    for tile in (low - 1, high + 1):  # just outside the range the help gives: refused, naming --tile
        assert main([command, *needs[command], "--out", str(tmp_path / "s.png"), "--tile", str(tile)]) == 2
        assert f"--tile must be between {low} and {high} pixels" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flag", "stage", "field"),
    [
        ("pretrain", "--lr-start", "pretrain", "lr_start"),
        ("train", "--decoder-lr", "train", "decoder_lr"),
        ("train", "--warmup-frac", "train", "warmup_frac"),
        ("train", "--decay", "train", "decay"),
    ],
)
def test_training_help_gives_the_value_a_run_takes(command, flag, stage, field):
    """The training flags default to None and take the stage's value when the config is resolved: that value."""
    value = getattr(TrainConfig(stage=stage).resolved(), field)
    shown = f"{value:g}" if isinstance(value, float) else value
    assert f"(default {shown}" in _option(command, flag).help


def test_pretrain_procedures_help_names_the_default():
    assert (
        f"'{TrainConfig(stage='pretrain').procedures}' (stand-in; the default)"
        in _option("pretrain", "--procedures").help
    )


def test_profile_help_does_not_promise_graphs_on_a_cpu():
    assert "a CPU has no graphs" in _option("profile", "--no-graphs").help
    assert "for a GPU" in _commands()["profile"].description
