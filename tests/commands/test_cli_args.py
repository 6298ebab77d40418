"""procap.commands.cli_args: the training flags of vqgan / pretrain / train and their mapping onto TrainConfig."""

from __future__ import annotations

import argparse
import json

import pytest

from procap.commands.cli_args import add_common_arguments, config_from_args, read_config_file
from procap.core.errors import ProCapError
from procap.data import DATASETS


def _parse(stage: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, stage)
    return parser.parse_args(["--out", "run", *argv])


def test_dataset_choices_come_from_the_registry(capsys):
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, "train")
    action = next(a for a in parser._actions if a.dest == "dataset")
    assert list(action.choices) == sorted(DATASETS)
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "run", "--dataset", "coco"])


@pytest.fixture(autouse=True)
def _in_a_folder_with_data(tmp_path, monkeypatch):
    """The flags name ``d`` (a dataset folder) and ``run`` (the output), relative to a fresh working folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()


def test_flags_map_onto_the_config_and_paper_defaults_fill_the_rest():
    untrained = ("--vqgan", "untrained")  # a new spot model needs a tokenizer (tests/commands/test_train_help.py)
    cfg = config_from_args(
        "train", _parse("train", "--data", "d", "--dataset", "spot-the-diff", "--steps", "5", *untrained)
    )
    assert (cfg.stage, cfg.data, cfg.steps, cfg.dataset) == ("train", "d", 5, "spot-the-diff")
    assert cfg.resolved().encoder_lr == DATASETS["spot-the-diff"].encoder_lr
    assert (
        config_from_args("pretrain", _parse("pretrain", "--data", "d", "--lr-start", "1e-7", *untrained)).lr_start
        == 1e-7
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--data", "d", "--steps", "0"), "--steps must be at least 1"),
        (("--data", "d", "--lr", "-1"), "--lr must be greater than 0"),
        (("--data", "d", "--warmup-frac", "5"), "--warmup-frac must be at most 1"),
        (("--data", "missing"), "--data missing does not exist"),
        (("--data", "d", "--preset", "huge"), "unknown preset 'huge'"),
        ((), "--data is required"),
    ],
)
def test_bad_values_are_one_sentence_errors(argv, message):
    with pytest.raises(ProCapError, match=message):
        config_from_args("train", _parse("train", *argv))


# -- config files: values quoted briefly, aliases bounded (issue 48, class E) ---------------------------------------
def _nested_aliases(levels: int, width: int) -> str:
    """YAML whose last key stands, through aliases, for ``width ** levels`` values in a few hundred bytes."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nsteps: *a{levels - 1}\n"


def test_a_config_value_of_the_wrong_type_is_quoted_briefly(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"steps": list(range(10**5))}), encoding="utf-8")
    with pytest.raises(ProCapError) as caught:
        read_config_file(config, "pretrain")
    message = str(caught.value)
    assert f"--config file {config}: steps must be an integer, got [0, 1, 2, 3, ...]." == message


def test_yaml_aliases_may_not_stand_for_a_huge_config(tmp_path):
    pytest.importorskip("yaml", reason="YAML needs the [train] extra (pyyaml)")
    config = tmp_path / "c.yaml"
    config.write_text(_nested_aliases(levels=5, width=10), encoding="utf-8")  # 111,110 values in 300 bytes
    with pytest.raises(ProCapError) as caught:
        read_config_file(config, "pretrain")
    message = str(caught.value)
    assert message.startswith(f"--config file {config} uses YAML aliases that add more than 10,000 values")
    config.write_text("steps: &s [1, *s]\n", encoding="utf-8")  # a value holding itself: endless to walk
    with pytest.raises(ProCapError, match="alias inside the value it names"):
        read_config_file(config, "pretrain")
    config.write_text("base: &b {x: 1}\nsteps: 3\n", encoding="utf-8")  # aliases as configs use them still work
    with pytest.raises(ProCapError, match="keys that are no training option: base"):
        read_config_file(config, "pretrain")
