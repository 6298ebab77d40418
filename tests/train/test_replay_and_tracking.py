"""Config replay (``--config``), the preset a run defaults to, and the TensorBoard / wandb trackers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os

import pytest

from procap.commands.cli import main
from procap.commands.cli_args import add_common_arguments, config_from_args
from procap.core.errors import ProCapError
from procap.train.config import TrainConfig
from procap.train.loop import JsonlLog, validation_line
from procap.train.tracking import scalars
from tests.support import parse_stage_args


def _pretrain(*argv: str) -> list[str]:
    return ["pretrain", "--steps", "2", "--batch-size", "4", "--log-every", "1", "--no-progress", *argv]


def _losses(out) -> list[float]:
    return [r["loss"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r]


def test_a_run_replays_from_its_config_and_flags_override_it(tmp_path, small_model, clevr_root):
    first = tmp_path / "first"
    assert main(_pretrain("--data", str(clevr_root), "--out", str(first), "--preset", "tiny", "--seed", "4")) == 0
    written = json.loads((first / "stage1_config.json").read_text())
    assert written["seed"] == 4 and written["preset"] == "tiny" and written["steps"] == 2

    # The file gives back every option of the run: replaying it is the same run, into a new folder (its own
    # folder holds the finished run, which a replay may not write over without --overwrite).
    config = str(first / "stage1_config.json")
    with pytest.raises(ProCapError, match="holds a finished `procap pretrain` run; pass --resume"):
        config_from_args("pretrain", parse_stage_args("pretrain", "--config", config))
    replay = str(tmp_path / "replay")
    replayed = config_from_args("pretrain", parse_stage_args("pretrain", "--config", config, "--out", replay))
    assert replayed.resolved().to_dict() == {k: v for k, v in written.items() if k != "data_parallel"} | {
        "val_metrics": tuple(written["val_metrics"]),
        "loggers": (),
        "out": replay,
    }
    overwriting = config_from_args("pretrain", parse_stage_args("pretrain", "--config", config, "--overwrite"))
    assert overwriting.out == str(first) and overwriting.seed == 4 and overwriting.overwrite
    changed = parse_stage_args("pretrain", "--config", config, "--seed", "9", "--out", "x")
    assert (config_from_args("pretrain", changed).seed, config_from_args("pretrain", changed).out) == (9, "x")


def test_a_yaml_config_gives_the_same_options(tmp_path, clevr_root):
    yaml = pytest.importorskip("yaml", reason="YAML configs need the [train] extra (pyyaml)")
    options = {"data": str(clevr_root), "out": "run", "preset": "tiny", "steps": 7, "val_metrics": ["BLEU-4", "CIDEr"]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(options))
    (tmp_path / "c.json").write_text(json.dumps(options))
    from_yaml = config_from_args("train", parse_stage_args("train", "--config", str(tmp_path / "c.yaml")))
    assert from_yaml == config_from_args("train", parse_stage_args("train", "--config", str(tmp_path / "c.json")))
    assert from_yaml.steps == 7 and from_yaml.val_metrics == ("BLEU-4", "CIDEr")


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"stage": "train", "steps": 3}', "is a `procap train` config, not `procap pretrain`"),
        ('{"steps": 3, "learning_speed": 2}', "no training option: learning_speed"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "does not hold a mapping"),
    ],
)
def test_bad_config_files_are_one_sentence(tmp_path, clevr_root, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ProCapError, match=message):
        config_from_args("pretrain", parse_stage_args("pretrain", "--config", str(path), "--data", str(clevr_root)))


def test_without_preset_a_new_model_takes_the_datasets_paper_preset_and_says_so(tmp_path, clevr_root, caplog):
    caplog.set_level(logging.INFO, logger="procap")  # the notes are INFO records (on stderr from the command line)
    untrained = ("--vqgan", "untrained")  # a paper preset's new model needs a tokenizer (test_train_help.py)
    args = parse_stage_args(
        "train", "--data", str(clevr_root), "--out", "run", "--dataset", "spot-the-diff", *untrained
    )
    assert config_from_args("train", args).preset == "spot"
    assert "using 'spot', the paper's preset for spot-the-diff" in caplog.text
    args = parse_stage_args("train", "--data", str(clevr_root), "--out", "r", *untrained)
    assert config_from_args("train", args).preset == "clevr"
    caplog.clear()
    init = tmp_path / "s1.safetensors"
    init.write_bytes(b"x")  # unreadable: loading it names the file (test_checkpoint.py); no preset is announced here
    config_from_args("train", parse_stage_args("train", "--data", str(clevr_root), "--out", "r", "--init", str(init)))
    config_from_args(
        "train", parse_stage_args("train", "--data", str(clevr_root), "--out", "r", "--preset", "tiny", *untrained)
    )
    assert caplog.text == ""  # the checkpoint's model, or a preset asked for: nothing to announce
    with pytest.raises(ProCapError, match="--out is required"):
        config_from_args("train", parse_stage_args("train", "--data", str(clevr_root)))


@pytest.mark.parametrize("stage", ["vqgan", "pretrain", "train"])
def test_bad_data_is_refused_before_the_default_notes(tmp_path, capsys, stage):
    """The notes of the filled-in defaults wait until the data has been read: a refusal stays one line."""
    (tmp_path / "empty").mkdir()
    tokenizer = [] if stage == "vqgan" else ["--vqgan", "untrained"]  # vqgan trains the tokenizer itself
    code = main([stage, "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "run"), *tokenizer])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(lines) == 1 and "splits.json" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_the_default_notes_are_kept_for_the_caller_when_asked(clevr_root, capsys):
    notes: list[str] = []
    args = parse_stage_args("train", "--data", str(clevr_root), "--out", "r", "--vqgan", "untrained")
    assert config_from_args("train", args, notes).preset == "clevr"
    assert capsys.readouterr().err == ""
    assert len(notes) == 1 and "no --preset given: using 'clevr'" in notes[0]


def test_tensorboard_and_wandb_receive_the_logged_scalars(tmp_path, small_model, clevr_root, monkeypatch):
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing is sent; no account needed
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    argv = _pretrain("--data", str(clevr_root), "--out", str(out), "--preset", "tiny")
    assert main([*argv, "--logger", "tensorboard", "--logger", "wandb"]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    losses = [event.value for event in events.Scalars("stage1/loss")]
    assert losses == pytest.approx(_losses(out), rel=1e-6) and len(losses) == 2
    logged_lrs = [r["lr"]["all"] for r in JsonlLog(out / "log.jsonl").records() if "lr" in r]
    assert [event.value for event in events.Scalars("stage1/lr/all")] == pytest.approx(logged_lrs)
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_scalars_flatten_and_validation_is_one_console_line():
    record = {
        "step": 3,
        "lr": {"encoder": 1e-4, "decoder": 2e-5},
        "val": {"CIDEr": 12.5},
        "note": "x",
        "nan": float("nan"),
    }
    assert scalars({**record, "ok": True}) == {"step": 3.0, "lr/encoder": 1e-4, "lr/decoder": 2e-5, "val/CIDEr": 12.5}
    assert scalars({"losses": [0.5, 0.25]}) == {"losses/0": 0.5, "losses/1": 0.25}
    line = validation_line("stage2", 40, {"CIDEr": 112.3, "acc_change": 0.981, "distinct": 0.5, "correctness": 0.75})
    assert line == "stage2 step 40 validation: CIDEr 112.30, acc_change 98.1%, distinct 50.0%, correctness 75.0%"
    named = validation_line("stage2", 40, {"CIDEr": 112.3}, run="static")
    assert named == "stage2 step 40 validation (static): CIDEr 112.30"


def test_the_wandb_project_and_run_name_come_from_flags_then_the_environment(tmp_path, monkeypatch, clevr_root):
    import sys
    import types

    from procap.train.tracking import RunTrackers, wandb_identity

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_NAME", raising=False)
    assert wandb_identity("stage2") == ("procap", "stage2")
    monkeypatch.setenv("WANDB_PROJECT", "levir-runs")
    monkeypatch.setenv("WANDB_NAME", "k2-seed0")
    assert wandb_identity("stage2") == ("levir-runs", "k2-seed0")
    assert wandb_identity("stage2", "flag-project", "flag-name") == ("flag-project", "flag-name")

    started = []
    fake = types.ModuleType("wandb")  # stands in for wandb: records what a run would be started with
    fake.init = lambda **options: started.append(options) or types.SimpleNamespace(finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    RunTrackers(("wandb",), tmp_path, "stage2", {}).close()
    RunTrackers(("wandb",), tmp_path, "stage2", {}, project="p", run_name="n").close()
    assert [(s["project"], s["name"]) for s in started] == [("levir-runs", "k2-seed0"), ("p", "n")]

    args = parse_stage_args(
        "train",
        "--data",
        str(clevr_root),
        "--out",
        str(tmp_path / "run"),
        "--preset",
        "tiny",
        "--wandb-project",
        "p",
        "--wandb-name",
        "n",
    )
    config = config_from_args("train", args)
    assert (config.wandb_project, config.wandb_name) == ("p", "n")


def test_a_replay_from_another_folder_reads_the_same_data(tmp_path, small_model, clevr_root, monkeypatch):
    # the first run names its data and folder relative to where it starts
    monkeypatch.chdir(clevr_root.parent)
    first = clevr_root.parent / "replay-first"
    assert main(_pretrain("--data", clevr_root.name, "--out", first.name, "--preset", "tiny", "--seed", "4")) == 0
    written = json.loads((first / "stage1_config.json").read_text())
    assert (written["data"], written["out"]) == (str(clevr_root), str(first))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # (its own folder holds a finished run now: a replay there needs --overwrite, which replaces it)
    replayed = config_from_args(
        "pretrain", parse_stage_args("pretrain", "--config", str(first / "stage1_config.json"), "--overwrite")
    )
    assert (replayed.data, replayed.out) == (str(clevr_root), str(first))
    # the replay trains on the same data: the same losses, into the folder given on the command line
    again = tmp_path / "replay-again"
    assert main(["pretrain", "--config", str(first / "stage1_config.json"), "--out", str(again)]) == 0
    assert _losses(again) == _losses(first)


@pytest.mark.parametrize("source", ["crossfade", "truth"])
def test_relative_paths_in_a_config_file_are_read_against_its_folder(tmp_path, clevr_root, monkeypatch, source):
    configs = tmp_path / "configs"
    configs.mkdir()
    data = os.path.relpath(clevr_root, configs)
    options = {"data": data, "out": "../runs/x", "preset": "tiny", "procedures": source, "steps": 3}
    (configs / "c.json").write_text(json.dumps(options))
    monkeypatch.chdir(clevr_root)  # anywhere else
    config = config_from_args("pretrain", parse_stage_args("pretrain", "--config", str(configs / "c.json")))
    assert (config.data, config.out) == (str(clevr_root), str(tmp_path / "runs" / "x"))
    assert config.procedures == source  # a name, not a path
    assert config.replay_dict()["procedures"] == source and "h5py" not in config.optional_packages()


def test_a_resumed_runs_config_replays_as_a_new_run(tmp_path, small_model, clevr_root):
    out = tmp_path / "run"
    assert main(_pretrain("--data", str(clevr_root), "--out", str(out), "--preset", "tiny")) == 0
    assert main(_pretrain("--data", str(clevr_root), "--out", str(out), "--preset", "tiny", "--resume")) == 0
    written = json.loads((out / "stage1_config.json").read_text())
    assert written["resume"] is False and written["overwrite"] is False
    replayed = config_from_args(
        "pretrain",
        parse_stage_args("pretrain", "--config", str(out / "stage1_config.json"), "--out", str(tmp_path / "new")),
    )
    assert replayed.resume is False
    resumed = parse_stage_args("pretrain", "--config", str(out / "stage1_config.json"), "--resume")
    assert config_from_args("pretrain", resumed).resume is True  # continuing is asked on the command line


@pytest.mark.parametrize("stage", ["vqgan", "pretrain", "train"])
def test_every_boolean_option_has_both_forms(stage):
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, stage)
    flags = {action.dest: action for action in parser._actions}
    booleans = [f.name for f in dataclasses.fields(TrainConfig) if str(f.type).startswith("bool")]
    present = [name for name in booleans if name in flags]
    assert {"amp", "progress", "resume", "cache_images", "cache_features"} <= set(present)
    for name in present:
        action = flags[name]
        assert isinstance(action, argparse.BooleanOptionalAction), name
        assert action.default is None, name  # not given: the config file or the default decides
        on, off = action.option_strings
        assert off == on.replace("--", "--no-", 1)


def test_a_files_boolean_is_flipped_back_on_the_command_line(tmp_path, clevr_root):
    flipped = {"amp": False, "progress": False, "cache_images": False, "cache_features": True, "encoder_warmup": False}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"data": str(clevr_root), "out": "run", "preset": "tiny"} | flipped))
    from_file = config_from_args("train", parse_stage_args("train", "--config", str(path)))
    assert {name: getattr(from_file, name) for name in flipped} == flipped
    argv = ["--amp", "--progress", "--cache", "--no-cache-features", "--encoder-warmup"]
    back = config_from_args("train", parse_stage_args("train", "--config", str(path), *argv))
    assert {name: getattr(back, name) for name in flipped} == {name: not value for name, value in flipped.items()}
