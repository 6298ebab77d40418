"""--batch-size: a batch above the items is cut to them and said so; one that cannot fit is refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from procap.commands.cli import main
from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.train import batch_memory


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict[str, Path]:
    """A 20-scene synthetic benchmark at 16 px and a one-layer checkpoint trained on nothing."""
    from procap.data import load_split
    from procap.data.synthetic import generate
    from procap.loading.checkpoint import save_checkpoint
    from procap.train.common import build_vocab
    from tests.support import micro_model

    root = tmp_path_factory.mktemp("batch_memory")
    data = root / "data"
    generate(data, 20, size=16, seed=3, progress=False)
    vocab = build_vocab(load_split("clevr-change", data, "train"), "clevr-change")
    ckpt = save_checkpoint(root / "model.safetensors", micro_model(len(vocab)), vocab)
    return {
        "data": data,
        "ckpt": ckpt,
        "bef": data / "images" / "CLEVR_default_000000.png",
        "aft": data / "sc_images" / "CLEVR_semantic_000000.png",
    }


@pytest.fixture
def small_machine(monkeypatch):
    """A machine of 64 KiB: a batch of more than one 16 px pair is out of reach."""
    monkeypatch.setattr(batch_memory, "device_memory", lambda device=None: (2**16, "the 64 KiB of a test machine"))


def test_the_bound_grows_with_the_batch_and_with_training():
    config = get_preset("tiny")
    one = batch_memory.batch_bytes(config, 1)
    assert batch_memory.batch_bytes(config, 8) == 8 * one
    assert batch_memory.batch_bytes(config, 1, "train") > one  # activations kept for the backward pass
    assert batch_memory.batch_bytes(config, 1, "pretrain") > batch_memory.batch_bytes(config, 1, "train")
    assert batch_memory.batch_bytes(get_preset("clevr"), 1) > one  # 224 px, 12 layers
    with pytest.raises(ValueError):
        batch_memory.batch_bytes(config, 1, "nope")


def test_the_default_batches_fit_on_a_small_machine():
    """The paper's batches (8 stage 1, 16 stage 2) at 224 px stay below 8 GiB: the check refuses nothing usual."""
    clevr = get_preset("clevr")
    assert batch_memory.batch_bytes(clevr, 8, "pretrain") < 8 * 2**30
    assert batch_memory.batch_bytes(clevr, 16, "train") < 8 * 2**30
    assert batch_memory.batch_bytes(clevr, 32, "inference") < 8 * 2**30


def test_machine_memory_is_known():
    total, words = batch_memory.device_memory("cpu")
    assert total > 2**28 and "memory of this machine" in words


def test_a_batch_that_cannot_fit_is_refused_naming_the_flag(small_machine):
    with pytest.raises(ProCapError, match=r"^--batch-size 4096 needs at least .* 64 KiB .*lower --batch-size\.$"):
        batch_memory.check_batch(get_preset("tiny"), 4096, "train")


def test_caption_cuts_a_batch_above_the_pairs_and_says_so(bench, capsys):
    argv = ["caption", "--ckpt", str(bench["ckpt"]), str(bench["bef"]), str(bench["aft"])]
    assert main([*argv, "--batch-size", "500"]) == 0
    err = capsys.readouterr().err
    assert "--batch-size 500 is more than the 1 pairs given; using batches of 1" in err
    assert main(argv) == 0  # the default batch (32) is cut without a word
    assert "--batch-size" not in capsys.readouterr().err


def test_caption_refuses_a_batch_that_cannot_fit(bench, small_machine, capsys):
    pairs = [str(bench["bef"]), str(bench["aft"])] * 100
    code = main(["caption", "--ckpt", str(bench["ckpt"]), *pairs, "--batch-size", "100"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("procap: error: --batch-size 100 needs at least"), err


def test_evaluate_refuses_up_front_and_writes_nothing(bench, small_machine, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["evaluate", "--ckpt", str(bench["ckpt"]), "--data", str(bench["data"]), "--out", str(out)]
    code = main([*argv, "--metrics", "BLEU-4", "--batch-size", "1000000"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err  # one sentence, no note before it
    assert err.startswith("procap: error: --batch-size 1000000 (cut to the 10 test pairs) needs at least"), err
    assert not out.exists()
    assert main([*argv, "--metrics", "BLEU-4", "--batch-size", "1000000", "--max-pairs", "1"]) == 0
    err = capsys.readouterr().err
    assert "procap evaluate: --batch-size 1000000 is more than the 1 test pairs; using batches of 1" in err


def _train_config(bench, **changes):
    from procap.train.config import TrainConfig

    return TrainConfig(stage="train", preset="tiny", data=str(bench["data"]), device="cpu", **changes)


def test_training_checks_the_batch_the_sampler_will_use(bench):
    """One process cuts a batch above the training items to them (and says so), so that batch is checked."""
    batch_memory.check_training_batch(_train_config(bench, batch_size=10**12))  # 20 items: fits
    with pytest.raises(ProCapError, match="--batch-size 1000000000000 needs"):
        batch_memory.check_training_batch(_train_config(bench, batch_size=10**12, grad_accum=2))


def test_a_cut_training_batch_that_still_cannot_fit_names_both_sizes(bench, small_machine):
    with pytest.raises(ProCapError, match=r"--batch-size 1000 \(cut to the 20 training items\) needs at least"):
        batch_memory.check_training_batch(_train_config(bench, batch_size=1000))


def test_training_refuses_before_reading_anything(bench, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--data", str(bench["data"]), "--out", str(out), "--preset", "tiny", "--steps", "1"]
    assert main([*argv, "--batch-size", str(10**12), "--grad-accum", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error: --batch-size 1000000000000 needs at least") and err.count("\n") == 1
    assert not out.exists()
