"""Training loops end to end on a 16 px model: a step lowers the loss, resume is exact, best-by-CIDEr, CLI."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from procap.core.errors import ProCapError
from procap.loading.checkpoint import load_checkpoint, read_checkpoint_metadata
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.datasets import PairDataset
from procap.train.loop import JsonlLog, Trainer
from procap.train.schedules import stage2_optimizer


def test_one_step_reduces_loss(tmp_path, model, vocab, train_pairs):
    cfg = TrainConfig(
        stage="train",
        out=str(tmp_path),
        steps=1,
        batch_size=8,
        lr=3e-3,
        warmup_frac=0.0,
        progress=False,
        device="cpu",  # the fixture model lives on the CPU; on a GPU machine "auto" would move only the batch
    ).resolved()
    data = PairDataset(train_pairs, vocab, 16, 12)
    batch = {k: torch.stack([data[i][k] for i in range(8)]) for k in ("before", "after", "caption")}

    def loss_fn(b):
        return model.stage2_loss(b["before"], b["after"], b["caption"])

    trainer = Trainer(
        cfg,
        model,
        data,
        loss_fn,
        lambda total: stage2_optimizer(model, cfg, total),
        save_weights=lambda p, e: None,
        load_weights=lambda p: None,
    )
    with torch.no_grad():
        before = loss_fn(batch)["loss"].item()
    record = trainer.train_step(batch)
    with torch.no_grad():
        after = loss_fn(batch)["loss"].item()
    assert record["loss"] == pytest.approx(before, rel=1e-5)
    assert after < before - 1e-3


def _stage1_config(out, **kw):
    return TrainConfig(
        stage="pretrain",
        out=str(out),
        steps=6,
        batch_size=4,
        lr=1e-3,
        warmup_steps=2,
        save_every=3,
        log_every=1,
        progress=False,
        seed=5,
        **kw,
    )


def _losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r}


def test_resume_continues_with_identical_losses(tmp_path, small_model, train_pairs, vocab, monkeypatch):
    from procap.train.stage1 import pretrain

    pretrain(_stage1_config(tmp_path / "full"), pairs=train_pairs, vocab=vocab)
    reference = _losses(tmp_path / "full")
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]

    calls = {"n": 0}
    original = ProCap.stage1_loss

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # after the step-3 save, during step 5
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProCap, "stage1_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_stage1_config(tmp_path / "cut"), pairs=train_pairs, vocab=vocab)
    monkeypatch.setattr(ProCap, "stage1_loss", original)
    assert read_checkpoint_metadata(tmp_path / "cut" / "last.safetensors")["extra"]["step"] == 3

    pretrain(_stage1_config(tmp_path / "cut", resume=True), pairs=train_pairs, vocab=vocab)
    resumed = [r for r in JsonlLog(tmp_path / "cut" / "log.jsonl").records() if "loss" in r]
    after_resume = {r["step"]: r["loss"] for r in resumed[-3:]}
    assert sorted(after_resume) == [4, 5, 6]
    for step in (4, 5, 6):
        assert after_resume[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step
    assert read_checkpoint_metadata(tmp_path / "cut" / "stage1.safetensors")["extra"]["step"] == 6


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, small_model, train_pairs, vocab):
    from procap.train.stage1 import pretrain

    with pytest.raises(ProCapError, match="no checkpoint to resume"):
        pretrain(_stage1_config(tmp_path / "empty", resume=True), pairs=train_pairs, vocab=vocab)


def test_stage2_keeps_best_by_validation_cider(tmp_path, small_model, clevr_root, train_pairs, vocab):
    from procap.train.stage1 import pretrain
    from procap.train.stage2 import train

    init = pretrain(
        TrainConfig(stage="pretrain", out=str(tmp_path / "s1"), steps=2, batch_size=4, progress=False),
        pairs=train_pairs,
        vocab=vocab,
    )
    cfg = TrainConfig(
        stage="train",
        data=str(clevr_root),
        out=str(tmp_path / "s2"),
        init=str(init),
        steps=4,
        batch_size=4,
        lr=1e-3,
        val_every=2,
        val_pairs=6,
        progress=False,
        cache_features=True,
    )
    best = train(cfg, pairs=train_pairs)
    records = JsonlLog(tmp_path / "s2" / "log.jsonl").records()
    vals = [r for r in records if "val/CIDEr" in r]
    assert [r["step"] for r in vals] == [2, 4]
    meta = read_checkpoint_metadata(best)
    assert best.name == "best.safetensors" and meta["extra"]["val"]["CIDEr"] == max(r["val/CIDEr"] for r in vals)
    model, loaded_vocab, _ = load_checkpoint(best)
    assert model.config.num_keyframes == 1 and len(loaded_vocab) == len(vocab)
    assert json.loads((tmp_path / "s2" / "stage2_config.json").read_text())["init"] == str(init)


def test_stage2_selects_by_correctness_when_asked(tmp_path, small_model, clevr_root, train_pairs, vocab):
    from procap.train.stage2 import train

    cfg = TrainConfig(
        stage="train",
        data=str(clevr_root),
        out=str(tmp_path / "s2"),
        steps=6,
        batch_size=4,
        lr=1e-3,
        val_every=2,
        val_pairs=6,
        progress=False,
        select_metric="correctness",
    )
    best = train(cfg, pairs=train_pairs, vocab=vocab)
    vals = [r for r in JsonlLog(tmp_path / "s2" / "log.jsonl").records() if "val/correctness" in r]
    assert [r["step"] for r in vals] == [2, 4, 6]
    for r in vals:  # the mean of the correctness fractions the validation has (type and object need changes)
        parts = [r[k] for k in ("val/acc_change", "val/acc_type", "val/acc_object") if k in r]
        assert r["val/correctness"] == pytest.approx(sum(parts) / len(parts))
    picked = read_checkpoint_metadata(best)["extra"]
    first_best = max(vals, key=lambda r: r["val/correctness"])  # ties keep the earliest
    assert picked["step"] == first_best["step"]
    assert picked["val"]["correctness"] == first_best["val/correctness"]


def test_correctness_selection_needs_truths(tmp_path, train_pairs, vocab):
    from procap.train.stage2 import train

    with pytest.raises(ValueError, match="select_metric must be one of"):
        TrainConfig(stage="train", select_metric="BLEU")
    cfg = TrainConfig(stage="train", out=str(tmp_path / "s2"), steps=1, batch_size=2, select_metric="correctness")
    with pytest.raises(ProCapError, match="--select correctness needs each validation pair's truth"):
        train(cfg, pairs=train_pairs, val_pairs=train_pairs[:2], vocab=vocab, truths={})
    assert not (tmp_path / "s2").exists()


def test_evaluate_command_writes_results(tmp_path, model, vocab, clevr_root, capsys):
    from procap.commands.cli import main
    from procap.loading.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    code = main(
        [
            "evaluate",
            "--ckpt",
            str(ckpt),
            "--data",
            str(clevr_root),
            "--split",
            "test",
            "--metrics",
            "BLEU-4",
            "CIDEr",
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert set(report["metrics"]) >= {"BLEU-4", "CIDEr"} and "total" in report["by_type"]
    assert report["by_type"]["total"]["pairs"] == report["pairs"]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert len(results) == report["pairs"] and {"image_id", "caption"} <= set(results[0])
    assert "captions/s" in capsys.readouterr().out
    # the file `procap score --refs` needs, which no command wrote before
    argv = ["--pred", str(tmp_path / "eval" / "results.json"), "--refs", str(tmp_path / "eval" / "references.json")]
    assert main(["score", *argv, "--metrics", "bleu"]) == 0


def test_cli_errors_are_one_sentence(tmp_path, capsys):
    from procap.commands.cli import main

    assert main(["evaluate", "--ckpt", str(tmp_path / "nope.safetensors"), "--data", str(tmp_path)]) == 2
    assert "nope.safetensors" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--preset", "huge"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_vqgan_training_lowers_reconstruction_loss(tmp_path, train_pairs, monkeypatch):
    import procap.train.vqgan_train as vt
    from procap.core.config import get_preset
    from tests.support import small_training_config as small

    monkeypatch.setattr(vt, "get_preset", lambda name: small(30) if name == "tiny" else get_preset(name))
    cfg = TrainConfig(
        stage="vqgan", out=str(tmp_path), steps=12, batch_size=8, lr=2e-3, warmup_steps=1, log_every=1, progress=False
    )
    path = vt.train_vqgan(cfg, pairs=train_pairs)
    losses = [r["l1"] for r in JsonlLog(tmp_path / "log.jsonl").records()]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3])
    assert list(JsonlLog(tmp_path / "log.jsonl").records()[0]["lr"]) == ["vqgan"]  # the group's name labels its lr
    vqgan = vt.load_vqgan(path)
    assert vqgan.config.resolution == 16


def test_a_batch_larger_than_the_data_is_announced(tmp_path, model, vocab, train_pairs, caplog):
    """A --batch-size above the size of the split is clamped to the split, and the run warns (a logged warning: the
    command line shows it on stderr)."""
    cfg = TrainConfig(stage="train", out=str(tmp_path), steps=1, batch_size=10_000, progress=False, device="cpu")
    data = PairDataset(train_pairs, vocab, 16, 12)
    trainer = Trainer(cfg.resolved(), model, data, lambda b: {}, lambda total: (None, None), None, None)
    assert trainer.sampler.batch_size == len(data)
    [record] = [r for r in caplog.records if r.name == "procap.train.loop"]
    assert record.levelno == logging.WARNING
    assert f"--batch-size 10000 is more than the {len(data)} training items" in record.getMessage()


def test_a_short_run_logs_enough_points_for_a_curve(tmp_path, model, vocab, train_pairs):
    """--log-every shrinks so that a run logs at least MIN_LOGGED_POINTS records (every step of a shorter run)."""
    data = PairDataset(train_pairs, vocab, 16, 12)
    for steps, expected in ((10, 1), (200, 10), (5000, 10)):
        cfg = TrainConfig(stage="train", out=str(tmp_path), steps=steps, batch_size=2, log_every=10, progress=False)
        trainer = Trainer(cfg.resolved(), model, data, lambda b: {}, lambda total: (None, None), None, None)
        assert trainer.log_every == expected


def test_evaluate_fast_beams_and_samples_match_the_oracle_on_the_cpu(tmp_path, model, vocab, clevr_root):
    """`--fast` (the Captioner, fp32 on the CPU) writes the captions of `--exact`, with `--beams` and with
    `--strategy sample` too."""
    from procap.commands.cli import main
    from procap.loading.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    base = ["evaluate", "--ckpt", str(ckpt), "--data", str(clevr_root), "--metrics", "BLEU-4", "--max-pairs", "6"]
    base += ["--device", "cpu"]  # a GPU machine would default to CUDA, where --fast runs bf16
    results = {}
    sample = ["--strategy", "sample", "--top-p", "0.9", "--seed", "2"]
    recorded = {
        "exact": {"strategy": "greedy"},
        "fast": {"strategy": "greedy"},
        "beams": {"strategy": "beam", "num_beams": 3, "length_penalty": 1.0},
        "samples": {"strategy": "sample", "temperature": 1.0, "top_k": 0, "top_p": 0.9, "seed": 2},
    }
    runs = {
        "exact": ["--exact"],
        "fast": ["--fast"],
        "beams": ["--fast", "--beams", "3"],
        "samples": ["--fast", *sample],
    }
    for name, flags in runs.items():
        assert main([*base, *flags, "--out", str(tmp_path / name)]) == 0
        results[name] = json.loads((tmp_path / name / "results.json").read_text())
        decoding = json.loads((tmp_path / name / "metrics.json").read_text())["decoding"]
        assert decoding == {"path": "exact" if name == "exact" else "fast", **recorded[name]}
    assert results["fast"] == results["exact"] != results["samples"]
    for name, flags in {"beams": ["--beams", "3"], "samples": sample}.items():
        assert main([*base, "--exact", *flags, "--out", str(tmp_path / f"exact_{name}")]) == 0
        assert json.loads((tmp_path / f"exact_{name}" / "results.json").read_text()) == results[name]
