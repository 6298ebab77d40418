"""`procap demo`: the benchmark's viewpoint and the stage-1 procedure source passed through to its runs, and the
failure kinds in its tables and metrics.json."""

from __future__ import annotations

import dataclasses
import json

import pytest

from procap.core.errors import ProCapError
from procap.experiments.demo import aggregate, format_failures, run_demo
from procap.loading.checkpoint import read_checkpoint_metadata
from tests.support import micro_demo_budget


@pytest.mark.slow
def test_demo_with_a_viewpoint_and_truth_procedures(tmp_path):
    summary = run_demo(
        tmp_path, budget=micro_demo_budget(), procedures="truth", viewpoint="distractor", progress=False, jobs=1
    )
    assert summary["viewpoint"] == "distractor" and summary["procedures"] == "truth"
    assert summary["keyframes"] == {}  # no cache, so no confidence scores to describe
    scenes = json.loads((tmp_path / "data" / "scenes.json").read_text())
    assert scenes["viewpoint"] == "distractor" and all("after_view" in s for s in scenes["scenes"])
    assert not (tmp_path / "procedures").exists()
    stage1 = read_checkpoint_metadata(tmp_path / "stage1" / "stage1.safetensors")
    assert stage1["extra"]["procedures"] == "truth"
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["viewpoint"] == "distractor"
    for report in written["results"].values():
        accuracy = report["accuracy"]
        for key in ("miss_rate", "false_positive_rate", "move_as_add_drop"):
            assert accuracy[key] is None or 0.0 <= accuracy[key] <= 1.0, key
        assert accuracy["unparsed"] == accuracy["unparsed_changes"] + accuracy["unparsed_distractors"]
        assert sum(sum(row.values()) for row in accuracy["confusion"].values()) == accuracy["pairs"]
        assert set(report["seeds"][0]["accuracy"]) >= {"miss_rate", "false_positive_rate", "unparsed_changes"}


def test_demo_refuses_an_unknown_viewpoint_or_source_before_writing(tmp_path):
    with pytest.raises(ProCapError, match="viewpoint must be one of"):
        run_demo(tmp_path, budget=micro_demo_budget(), viewpoint="sideways")
    with pytest.raises(ValueError, match="procedures must be one of interpolated, crossfade, truth"):
        run_demo(tmp_path, budget=micro_demo_budget(), procedures="flow")
    assert not any(tmp_path.iterdir())


def _report(seed: int, miss: float, false_positive: float, unparsed: int) -> dict:
    accuracy = {"change": 0.5, "type": 0.5, "object": 0.25, "new_value": None, "distinct": 1.0, "miss_rate": miss}
    accuracy |= {"false_positive_rate": false_positive, "move_as_add_drop": None, "unparsed_changes": unparsed}
    return {"seed": seed, "metrics": {"CIDEr": 100.0}, "accuracy": accuracy}


def test_the_failure_table_shows_each_kind_with_its_spread():
    results = {"static pair (k=0)": aggregate([_report(0, 0.1, 0.2, 3), _report(1, 0.3, 0.0, 1)], ["CIDEr"])}
    table = format_failures(results).splitlines()
    assert [t in table[0] for t in ("miss", "false pos.", "same image", "unparsed", "move as add/drop")] == [True] * 5
    row = table[2]
    assert row.startswith("static pair (k=0)")
    # miss 20 +- 14.1 %, false positives 10 +- 14.1 %, no identical images tried, unparsed 2 +- 1.4 change captions,
    # no move pairs
    assert row.split()[3:] == ["20.0", "±14.1", "10.0", "±14.1", "n/a", "2.0", "±1.4", "n/a"]


def test_the_cells_from_stage_1_fine_tune_their_encoder_below_the_decoder(tmp_path):
    from procap.experiments.demo import FULL, stage_configs

    budget = dataclasses.replace(micro_demo_budget(), stage2_lr=1e-3, stage2_encoder_lr=2e-4)
    configs = stage_configs(budget, tmp_path, tmp_path / "data", 0, "cpu", False, 0, tmp_path)
    for name in ("procap", "stage1_static"):  # a pre-trained encoder
        resolved = configs[name].resolved()
        assert (resolved.encoder_lr, resolved.decoder_lr) == (2e-4, 1e-3), name
    for name in ("procap_no_stage1", "static"):  # a random encoder learns at the decoder's rate
        resolved = configs[name].resolved()
        assert resolved.encoder_lr == resolved.decoder_lr == 1e-3, name
    # the full demo: stage 1 on every training pair, its encoder fine-tuned at the decoder's rate, which the
    # measurement at --viewpoint none favoured over a fifth of it (docs/training.md)
    assert FULL.stage1_pairs is None and FULL.stage2_encoder_lr is None


@pytest.mark.slow
def test_resume_reads_back_finished_seeds_and_trains_the_rest(tmp_path):
    options = {"budget": micro_demo_budget(), "procedures": "truth", "progress": False, "jobs": 1}
    first = run_demo(tmp_path, seeds=1, **options)
    trained = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("best.safetensors")}
    assert len(trained) == 4
    (tmp_path / "seed1" / "static").mkdir(parents=True)  # a second seed stopped part-way: trained from its start
    again = run_demo(tmp_path, seeds=2, resume=True, **options)
    assert all(path.stat().st_mtime_ns == stamp for path, stamp in trained.items())  # seed 0 read back
    assert len(list((tmp_path / "seed1").rglob("best.safetensors"))) == 4
    for label, report in again["results"].items():
        assert [r["seed"] for r in report["seeds"]] == [0, 1]
        assert report["seeds"][0] == first["results"][label]["seeds"][0]  # seed 0's figures as they were
    assert "resume" in again["phases_s"] and "resume" not in first["phases_s"]


def _write_finished_seed(folder, configs):
    """A seed's four evaluated runs as the demo leaves them (without checkpoints), trained with ``configs``."""
    from procap.experiments.demo import MODELS

    for name, _ in MODELS:
        run = folder / name
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps({"accuracy": {"change": 0.5}}))
        (run / "results.json").write_text(json.dumps([{"image_id": "a", "caption": "no change"}]))
        (run / "stage2_config.json").write_text(json.dumps(configs[name].resolved().to_dict()))


def test_resume_refuses_a_finished_seed_trained_with_other_settings(tmp_path):
    from procap.experiments.demo import FULL, MODELS, finished_reports, stage_configs

    configs = stage_configs(FULL, tmp_path, tmp_path / "data", 0, "cpu", False, 0, tmp_path)
    _write_finished_seed(tmp_path, configs)
    reports = finished_reports(tmp_path, configs)
    assert set(reports) == {name for name, _ in MODELS}
    assert reports["procap"]["predictions"] == {"a": "no change"} and reports["procap"]["accuracy"]["change"] == 0.5
    longer = {name: dataclasses.replace(cfg, steps=cfg.steps + 1) for name, cfg in configs.items()}
    with pytest.raises(ProCapError, match=r"procap was trained with other settings \(steps\)"):
        finished_reports(tmp_path, longer)
    # the seed's stage 1 on other procedures than this demo's: its two pre-trained cells would not be this design
    (tmp_path / "stage1").mkdir()
    stage1 = configs["stage1"].resolved().replay_dict()
    (tmp_path / "stage1" / "stage1_config.json").write_text(json.dumps(stage1 | {"procedures": "truth"}))
    with pytest.raises(ProCapError, match=r"stage1 was trained with other settings \(procedures\)"):
        finished_reports(tmp_path, configs)
    (tmp_path / "stage1" / "stage1_config.json").write_text(json.dumps(stage1))  # as written: paths absolute
    assert set(finished_reports(tmp_path, configs)) == {name for name, _ in MODELS}
    (tmp_path / "static" / "results.json").unlink()
    assert finished_reports(tmp_path, configs) is None  # unfinished: trained again


def test_resume_refuses_a_finished_seed_of_another_model_design(tmp_path):
    # The settings name the preset; its departures changed with issue 54 (the learned front end), so a seed trained
    # before would be averaged with one trained after unless the model itself is compared.
    from procap.core.config import get_preset
    from procap.data import Vocabulary
    from procap.experiments.demo import FULL, MODELS, PRESET, finished_reports, stage_configs
    from procap.loading.checkpoint import save_checkpoint
    from procap.model.procap import ProCap

    configs = stage_configs(FULL, tmp_path, tmp_path / "data", 0, "cpu", False, 0, tmp_path)
    _write_finished_seed(tmp_path, configs)
    vocab = Vocabulary.build(["the small red cube moved", "no change"])
    today = get_preset(PRESET, vocab_size=len(vocab))
    save_checkpoint(tmp_path / "procap" / "best.safetensors", ProCap(today), vocab)
    assert set(finished_reports(tmp_path, configs)) == {name for name, _ in MODELS}
    before = today.replace(image_encoder=0, learned_localisation=False, pixel_cnn=32)
    save_checkpoint(tmp_path / "static" / "best.safetensors", ProCap(before), vocab)
    with pytest.raises(ProCapError, match=r"static was trained with another model \(departure pixel_cnn, departure im"):
        finished_reports(tmp_path, configs)
    # a stage 1 weighed otherwise (issue 54 measured tiny with a consistency weight of 0.1)
    save_checkpoint(tmp_path / "static" / "best.safetensors", ProCap(today.replace(csy_weight=0.1)), vocab)
    with pytest.raises(ProCapError, match=r"static was trained with another model \(csy_weight\) than"):
        finished_reports(tmp_path, configs)


def test_the_full_demo_defaults_to_viewpoint_change_and_the_quick_one_to_none():
    from procap.commands.cli import build_parser
    from procap.experiments.demo import FULL, QUICK

    assert (FULL.viewpoint, QUICK.viewpoint) == ("distractor", "none")
    assert build_parser().parse_args(["demo"]).viewpoint is None  # resolved from the budget by run_demo


@pytest.mark.parametrize(("quick", "found", "wanted"), [(False, "none", "distractor"), (True, "distractor", "none")])
def test_resume_refuses_a_benchmark_of_another_viewpoint_before_writing(tmp_path, quick, found, wanted):
    data = tmp_path / "data"
    data.mkdir()
    (data / "scenes.json").write_text(json.dumps({"scenes": [], "size": 64, "seed": 0, "viewpoint": found}))
    before = sorted(tmp_path.rglob("*"))
    # no viewpoint given: the budget's, which differs from the folder's
    with pytest.raises(
        ProCapError, match=rf"viewpoint '{found}', this demo asks for '{wanted}'; pass --viewpoint {found}"
    ):
        run_demo(tmp_path, quick=quick, resume=True, progress=False, jobs=1)
    assert sorted(tmp_path.rglob("*")) == before


def test_cli_resume_with_another_viewpoint_is_one_sentence(tmp_path, capsys):
    from procap.commands.cli import main

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scenes.json").write_text(json.dumps({"scenes": [], "viewpoint": "none"}))
    assert main(["demo", "--out", str(tmp_path), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --viewpoint none" in err[0] and str(tmp_path / "data") in err[0]
