"""The demo's paired comparisons, read back from a finished demo folder (tools/paired_study.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from procap.data.datasets import load_split
from procap.data.synthetic import generate
from procap.eval.metrics import write_results
from procap.experiments.demo import INTERACTION, MODELS, format_paired, paired_from_folder, run_folder

ROOT = Path(__file__).resolve().parents[2]


def fake_demo_folder(out: Path, seeds: list[int]) -> list:
    """A demo folder whose ProCap is right on every test pair and whose other cells always say "no change"."""
    generate(out / "data", scenes=30, size=16, seed=0, progress=False)
    test = load_split("clevr-change", out / "data", "test")
    for seed in seeds:
        for name, _ in MODELS:
            captions = {p.id: (p.captions[0] if name == "procap" else "there is no change") for p in test}
            (run_folder(out, seed, seeds[0]) / name).mkdir(parents=True)
            write_results(run_folder(out, seed, seeds[0]) / name / "results.json", captions)
    return test


def test_paired_rows_from_a_finished_folder(tmp_path):
    test = fake_demo_folder(tmp_path, [5, 6])
    (tmp_path / "seed7" / "procap").mkdir(parents=True)  # a seed stopped before its evaluation does not count
    rows = paired_from_folder(tmp_path)
    pairwise = [r for r in rows if r["baseline"] != INTERACTION]
    assert len(pairwise) == 9 and {r["baseline"] for r in pairwise} == {l for n, l in MODELS if n != "procap"}
    # the three baselines caption alike, so the interaction is ProCap minus any of them
    interaction = {r["figure"]: r["difference"] for r in rows if r["baseline"] == INTERACTION}
    assert interaction == {r["figure"]: r["difference"] for r in pairwise if r["baseline"] == pairwise[0]["baseline"]}
    changes = sum(p.change_type != "no_change" for p in test)
    for row in pairwise:
        assert row["seeds"] == 2 and len(row["per_seed"]) == 2
        # the two seeds caption alike: no spread, the seed interval is the difference itself
        assert abs(row["seed_low"] - row["difference"]) < 1e-9 and abs(row["seed_high"] - row["difference"]) < 1e-9
        if row["figure"] == "change":  # right on the change pairs, tied on the distractors
            assert row["pairs"] == len(test)
            assert abs(row["difference"] - changes / len(test)) < 1e-9
        else:  # the baselines name no type and no object
            assert row["difference"] == row["model_accuracy"] == 1.0 and row["pairs"] == changes
    table = format_paired(rows)
    assert "stage 1, static pair (k=0)" in table and "2x2 interaction" in table and "over seeds" in table


def test_the_tool_writes_paired_json_and_refuses_a_folder_without_a_demo(tmp_path):
    fake_demo_folder(tmp_path / "demo", [0])
    tool = [sys.executable, str(ROOT / "tools" / "paired_study.py")]
    done = subprocess.run([*tool, str(tmp_path / "demo")], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert len(json.loads((tmp_path / "demo" / "paired.json").read_text())) == 12 and "interval" in done.stdout
    assert "n/a" in done.stdout  # one seed: no interval over seeds
    missing = subprocess.run([*tool, str(tmp_path / "nothing")], capture_output=True, text=True, cwd=ROOT, check=False)
    assert missing.returncode == 2 and "scenes.json" in missing.stderr and "Traceback" not in missing.stderr
