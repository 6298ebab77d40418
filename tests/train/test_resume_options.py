"""`--resume` continues the run as it was (issue 48, class C): every option the user does not repeat comes from the
run's saved config, and a repeated option that contradicts it is refused unless it is one a resume may change
(procap.train.config.RESUME_CHANGEABLE). A config file that is not UTF-8 is refused, not altered (class F)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from procap.commands.cli import main
from procap.commands.cli_args import config_from_args
from procap.core.errors import ProCapError
from procap.train.config import RESUME_CHANGEABLE, TrainConfig, resumed_values
from procap.train.loop import JsonlLog
from tests.support import parse_stage_args


@pytest.fixture
def stage2_run(tmp_path, clevr_root):
    """A stage-2 run folder as a run started with --val-pairs 50 --seed 7 --steps 20 leaves it (its config, marker
    and a last checkpoint to resume; the checkpoint's content is not read before the run starts)."""
    out = tmp_path / "run"
    out.mkdir()
    from procap.assets import demo_tokenizer_path

    options = {"data": str(clevr_root), "out": str(out), "preset": "tiny", "val_pairs": 50, "seed": 7, "steps": 20}
    options["vqgan"] = str(demo_tokenizer_path())  # as the command line fills it in
    config = TrainConfig(stage="train", **options).resolved()
    (out / "stage2_config.json").write_text(json.dumps({**config.replay_dict(), "data_parallel": {}}, indent=1))
    (out / "run.json").write_text(json.dumps({"kind": "train", "state": "running"}))
    (out / "last.safetensors").write_bytes(b"")
    return out


def test_a_resume_takes_every_option_it_is_not_given_from_the_run(stage2_run):
    """Without --val-pairs the resumed run validated on the default 200 pairs, where the run had used 50, and
    rewrote best's recorded score on another subset; --data had to be given again."""
    resumed = config_from_args("train", parse_stage_args("train", "--out", str(stage2_run), "--resume"))
    saved = json.loads((stage2_run / "stage2_config.json").read_text())
    assert (resumed.val_pairs, resumed.seed, resumed.steps, resumed.data) == (50, 7, 20, saved["data"])
    assert resumed.resume
    for field, value in resumed.resolved().replay_dict().items():
        if field not in ("out", "data_parallel"):
            assert json.loads(json.dumps(value)) == saved[field], field


def test_a_resume_refuses_an_option_that_contradicts_the_run(stage2_run, capsys):
    argv = ["train", "--out", str(stage2_run), "--resume", "--val-pairs", "200"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error: --resume: --val-pairs 200 differs from the 50 the run in ")
    assert "leave --val-pairs out" in err and err.count("\n") == 1
    with pytest.raises(ProCapError, match="--seed 8 differs from the 7"):
        config_from_args("train", parse_stage_args("train", "--out", str(stage2_run), "--resume", "--seed", "8"))
    same = config_from_args("train", parse_stage_args("train", "--out", str(stage2_run), "--resume", "--seed", "7"))
    assert same.seed == 7  # repeating the run's own value is no contradiction


def test_a_resume_may_extend_the_run_and_change_how_it_runs(stage2_run):
    argv = ["--out", str(stage2_run), "--resume", "--steps", "40", "--no-progress", "--workers", "2"]
    resumed = config_from_args("train", parse_stage_args("train", *argv))
    assert (resumed.steps, resumed.progress, resumed.workers, resumed.val_pairs) == (40, False, 2, 50)
    # the length is one choice: --epochs on resume drops the saved --steps, which would win over it
    by_epochs = config_from_args(
        "train", parse_stage_args("train", "--out", str(stage2_run), "--resume", "--epochs", "3")
    )
    assert (by_epochs.steps, by_epochs.epochs) == (None, 3)


def test_the_changeable_options_are_options_and_the_rule_compares_values_not_spellings(tmp_path):
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    assert fields >= RESUME_CHANGEABLE
    saved = {"data": str(tmp_path / "d"), "val_metrics": ["BLEU-4", "CIDEr"], "loggers": [], "lr": 0.001}
    given = {"data": str(tmp_path / "x" / ".." / "d"), "val_metrics": ("bleu", "CIDEr-D"), "lr": 1e-3}
    values, conflicts = resumed_values(saved, given)
    assert conflicts == [] and values["loggers"] == []
    assert resumed_values(saved, {"lr": 2e-3})[1] == ["lr"]


def test_a_resumed_pretrain_run_continues_with_its_own_options(tmp_path, small_model, clevr_root, capsys):
    """End to end through the command line: the first run's seed and pair count hold in the resumed run, which is
    given only its folder and a longer --steps."""
    out = tmp_path / "run"
    first = ["--data", str(clevr_root), "--out", str(out), "--preset", "tiny", "--seed", "4", "--max-pairs", "6"]
    common = ["--batch-size", "4", "--log-every", "1", "--no-progress"]
    assert main(["pretrain", "--steps", "2", *common, *first]) == 0
    assert main(["pretrain", "--out", str(out), "--resume", "--steps", "3"]) == 0
    written = json.loads((out / "stage1_config.json").read_text())
    assert (written["seed"], written["max_pairs"], written["steps"], written["batch_size"]) == (4, 6, 3, 4)
    capsys.readouterr()
    assert main(["pretrain", "--out", str(out), "--resume", "--batch-size", "2"]) == 2
    assert "--batch-size 2 differs from the 4" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_config_file_that_is_not_utf8_is_refused_not_altered(tmp_path, clevr_root, suffix):
    """A Latin-1 byte in a YAML config became U+FFFD without a word (the run used a name the file does not hold)."""
    if suffix == ".yaml":
        pytest.importorskip("yaml", reason="YAML configs need the [train] extra (pyyaml)")
    path = tmp_path / f"c{suffix}"
    text = f'{{"data": "{clevr_root}", "out": "run", "preset": "tiny", "wandb_name": "caf\xe9"}}'
    path.write_bytes(text.encode("latin-1"))
    position = text.encode("latin-1").index(b"\xe9")
    with pytest.raises(ProCapError, match=f"is not UTF-8 text \\(byte 0xe9 at position {position}\\)"):
        config_from_args("train", parse_stage_args("train", "--config", str(path)))
    path.write_bytes(text.encode("utf-8"))
    assert config_from_args("train", parse_stage_args("train", "--config", str(path))).wandb_name == "café"


def test_a_program_resuming_with_other_options_is_refused_by_the_library(tmp_path, small_model, train_pairs, vocab):
    """The command line fills a resume's options from the run's config file; a program builds its own TrainConfig,
    and the trainer itself compares it with that file, so an API resume cannot mix two runs' settings either."""
    from procap.train.stage1 import pretrain

    options = {"stage": "pretrain", "out": str(tmp_path / "run"), "batch_size": 4, "lr": 1e-3, "progress": False}
    options.update(warmup_steps=1, save_every=2, log_every=1, seed=5)
    pretrain(TrainConfig(**options, steps=2), pairs=train_pairs, vocab=vocab)
    with pytest.raises(
        ProCapError, match=r"TrainConfig\.lr = 0\.002 differs from the 0\.001 the run in .*stage1_config"
    ):
        pretrain(TrainConfig(**{**options, "lr": 2e-3}, steps=4, resume=True), pairs=train_pairs, vocab=vocab)
    with pytest.raises(ProCapError, match=r"TrainConfig\.seed = 6 differs"):
        pretrain(TrainConfig(**{**options, "seed": 6}, steps=4, resume=True), pairs=train_pairs, vocab=vocab)
    pretrain(TrainConfig(**options, steps=4, resume=True), pairs=train_pairs, vocab=vocab)  # longer: allowed
    steps = [r["step"] for r in JsonlLog(tmp_path / "run" / "log.jsonl").records() if "loss" in r]
    assert steps == [1, 2, 3, 4]
