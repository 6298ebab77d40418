"""k, the keyframes per pair, has one spelling wherever a user meets it (issue 49, item 6): ``-k`` /
``--num-keyframes`` on every command that takes it, ``num_keyframes`` in configs and the API; ``procap procedure``'s
earlier ``--keyframes`` is still read (hidden from the help) so scripts written for it keep working."""

from __future__ import annotations

import argparse

import pytest

from procap.commands.cli import build_parser

COMMANDS = {
    "procedure": ["--data", "d", "--pair", "p"],
    "pretrain": [],
    "train": [],
}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["-k", "--num-keyframes", "--keyframes"])
def test_every_spelling_sets_num_keyframes(command, flag):
    args = build_parser().parse_args([command, *COMMANDS[command], flag, "3"])
    assert args.num_keyframes == 3 and not hasattr(args, "keyframes")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_help_shows_one_spelling(command):
    text = _subparser(command).format_help()
    assert "-k K, --num-keyframes K" in text
    assert "--keyframes" not in text.replace("--num-keyframes", "")


def test_defaults_are_unchanged():
    assert build_parser().parse_args(["procedure", *COMMANDS["procedure"]]).num_keyframes == 2
    assert build_parser().parse_args(["train"]).num_keyframes is None  # the preset's or the checkpoint's


def test_the_old_flag_reports_errors_under_the_new_name(tmp_path, capsys):
    from procap.commands.cli import main

    (tmp_path / "data").mkdir()
    argv = ["procedure", "--data", str(tmp_path / "data"), "--pair", "p", "--vqgan", "x", "--keyframes", "99"]
    assert main(argv) == 2
    assert "--num-keyframes must be at most 15, got 99" in capsys.readouterr().err
