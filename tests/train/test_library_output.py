"""Training through the Python API says everything through the ``procap`` logger: silenced, it prints nothing;
under the command line's console handler, the same run shows its validation lines on stdout and its warnings on
stderr, as the command printed them before it logged."""

from __future__ import annotations

import logging

import pytest

from procap.core.logs import LOGGER_NAME, console_logging
from procap.train.config import TrainConfig

# More than the training pairs of the 12-scene fixture: the loop cuts the batch to the data and warns.
OVERSIZED_BATCH = 10_000


def _train_two_stages(root, out, train_pairs, vocab) -> None:
    """Two stage-1 steps, then two stage-2 steps validated at each: an INFO and a WARNING record at least."""
    from procap.train.stage1 import pretrain
    from procap.train.stage2 import train

    init = pretrain(
        TrainConfig(stage="pretrain", out=str(out / "s1"), steps=2, batch_size=4, progress=False),
        pairs=train_pairs,
        vocab=vocab,
    )
    config = TrainConfig(
        stage="train",
        data=str(root),
        out=str(out / "s2"),
        init=str(init),
        steps=2,
        batch_size=OVERSIZED_BATCH,
        val_every=1,
        val_pairs=2,
        progress=False,  # tqdm's bars are switched by the config, not by logging
    )
    train(config, pairs=train_pairs)


@pytest.fixture
def procap_logger():
    """The ``procap`` logger, its level put back after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_a_silenced_procap_logger_leaves_a_training_run_without_output(
    tmp_path, small_model, clevr_root, train_pairs, vocab, procap_logger, capfd
):
    procap_logger.setLevel(logging.CRITICAL)
    _train_two_stages(clevr_root, tmp_path, train_pairs, vocab)
    assert (tmp_path / "s2" / "best.safetensors").exists()  # it did train and validate
    assert capfd.readouterr() == ("", "")


def test_the_console_handler_puts_each_record_where_the_command_printed_it(
    tmp_path, small_model, clevr_root, train_pairs, vocab, capfd
):
    with console_logging(logging.INFO):
        _train_two_stages(clevr_root, tmp_path, train_pairs, vocab)
    out, err = capfd.readouterr()
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"stage2 step {step} validation (s2)" for step in (1, 2)
    ]
    assert f"stage2: --batch-size {OVERSIZED_BATCH} is more than the {len(train_pairs)} training items" in err
    assert "validation" not in err


def test_the_console_handler_shows_only_warnings_when_quiet(
    tmp_path, small_model, clevr_root, train_pairs, vocab, capfd
):
    with console_logging(logging.WARNING):
        _train_two_stages(clevr_root, tmp_path, train_pairs, vocab)
    out, err = capfd.readouterr()
    assert out == "" and "is more than the" in err
