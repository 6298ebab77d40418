"""The command line offers exactly the choices the library accepts: each list is written once, in procap.core.config."""

from __future__ import annotations

import argparse

import pytest
import torch

from procap.commands.cli import build_parser
from procap.core import config
from procap.data.datasets import SPLITS
from procap.model.decoding import STRATEGIES

# (command, flag) -> the library's list of allowed values
CHOICES = {
    ("prepare", "--frames"): config.GENERATED_FRAME_COUNTS,
    ("prepare", "--similarity"): config.FRAME_SIMILARITIES,
    ("prepare", "--split"): SPLITS,
    ("procedure", "--frames"): config.GENERATED_FRAME_COUNTS,
    ("procedure", "--sampling"): config.KEYFRAME_SAMPLING,
    ("caption", "--dtype"): config.COMPUTE_DTYPES,
    ("profile", "--dtype"): config.COMPUTE_DTYPES,
    ("evaluate", "--ablate"): config.ABLATABLE_PARTS,
    ("evaluate", "--split"): SPLITS,
    ("vocab", "--split"): SPLITS,
    ("train", "--decay"): config.LR_DECAYS,
    ("pretrain", "--decay"): config.LR_DECAYS,
    ("synth", "--viewpoint"): config.VIEWPOINTS,
    ("demo", "--viewpoint"): config.VIEWPOINTS,
    ("demo", "--procedures"): config.DEMO_PROCEDURES,
    ("caption", "--strategy"): tuple(STRATEGIES),
    ("evaluate", "--strategy"): tuple(STRATEGIES),
}


def _option(command: str, flag: str) -> argparse.Action:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return next(a for a in sub._actions if flag in a.option_strings)


@pytest.mark.parametrize(("command", "flag"), sorted(CHOICES))
def test_cli_choices_are_the_librarys(command, flag):
    assert tuple(_option(command, flag).choices) == tuple(CHOICES[command, flag])


def test_the_library_refuses_what_the_cli_does_not_offer():
    from procap.procedure.interpolate import levels_for
    from procap.procedure.sampling import sample_keyframes
    from procap.train.config import TrainConfig

    with pytest.raises(ValueError, match="generated frames"):
        levels_for(5)
    with pytest.raises(ValueError, match="decay"):
        TrainConfig(stage="train", decay="step")
    with pytest.raises(ValueError, match="sampling mode"):
        sample_keyframes(torch.ones(3), 1, mode="random")
    assert [levels_for(n) for n in config.GENERATED_FRAME_COUNTS] == [2, 3, 4]
