"""The demo's embedded tokenizer: it loads, records how it was made, and still gives its recorded probe figures."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import torch

from procap.core.config import get_preset
from procap.data import load_split
from procap.data.synthetic import generate
from procap.model.vqgan import VQGAN
from procap.train.tokenizer import (
    PROBE_ATTRIBUTES,
    embedded_tokenizer_info,
    embedded_tokenizer_path,
    probe_tokenizer,
    ship_tokenizer,
)


@pytest.fixture(scope="module")
def demo_benchmark(tmp_path_factory):
    """The benchmark the embedded tokenizer was trained and probed on (the recorded ``procap synth`` command)."""
    info = embedded_tokenizer_info()
    synth = shlex.split(next(c for c in info["commands"] if "procap synth" in c))
    args = dict(zip(synth[synth.index("synth") + 1 :: 2], synth[synth.index("synth") + 2 :: 2]))
    root = tmp_path_factory.mktemp("demo_data")
    generate(root, int(args["--scenes"]), size=int(args["--size"]), seed=int(args["--seed"]), workers=2)
    return root


def test_embedded_tokenizer_is_the_tiny_presets_and_says_how_it_was_made():
    path = embedded_tokenizer_path()
    assert path.is_file() and path.stat().st_size < 3_000_000
    vqgan = VQGAN.load(path)
    assert vqgan.config == get_preset("tiny").vqgan
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in vqgan.parameters())
    info = embedded_tokenizer_info()
    assert any("procap vqgan" in c and "--preset tiny" in c for c in info["commands"])
    assert info["steps"] >= 1000
    assert set(info["probe"]["features"]) == set(PROBE_ATTRIBUTES)


def test_embedded_tokenizer_reproduces_its_probe_figures(demo_benchmark):
    info = embedded_tokenizer_info()
    splits = {s: load_split("clevr-change", demo_benchmark, s) for s in ("train", "test")}
    torch.set_num_threads(1)
    result = probe_tokenizer(VQGAN.load(embedded_tokenizer_path()), demo_benchmark, splits["train"], splits["test"])
    for key in ("features", "pixels"):
        for attribute in PROBE_ATTRIBUTES:
            assert result[key][attribute] == pytest.approx(info["probe"][key][attribute], abs=0.02), (key, attribute)
    # what the demo needs from it: the changed object's colour and shape survive tokenization
    assert result["features"]["color"] >= 0.8 and result["features"]["shape"] >= 0.8


def test_probe_tells_a_random_tokenizer_from_the_trained_one(demo_benchmark):
    torch.manual_seed(0)
    splits = {s: load_split("clevr-change", demo_benchmark, s)[:400] for s in ("train", "test")}
    untrained = VQGAN(get_preset("tiny").vqgan)
    random = probe_tokenizer(untrained, demo_benchmark, splits["train"], splits["test"])
    trained = probe_tokenizer(VQGAN.load(embedded_tokenizer_path()), demo_benchmark, splits["train"], splits["test"])
    assert trained["features"]["color"] > random["features"]["color"] + 0.05
    assert trained["pixels"] == random["pixels"]  # the pixel ceiling does not depend on the tokenizer


def test_ship_writes_half_precision_with_commands_and_probe(tmp_path):
    data = tmp_path / "data"
    generate(data, 150, size=64, seed=1, workers=1)
    out = tmp_path / "shipped.safetensors"
    extra = ship_tokenizer(embedded_tokenizer_path(), out, data, ["procap vqgan --steps 3"])
    assert extra["commands"] == ["procap vqgan --steps 3"]
    state, meta = VQGAN.read_saved(out)
    assert all(t.dtype == torch.float16 for t in state.values())
    assert meta["extra"]["probe"] == extra["probe"]
    # re-shipping the shipped (already rounded) weights changes nothing
    original, _ = VQGAN.read_saved(embedded_tokenizer_path())
    assert all(torch.equal(state[k], original[k]) for k in original)


@pytest.mark.skipif(
    os.environ.get("PROCAP_REPRODUCE_TOKENIZER") != "1",
    reason="retrains the tokenizer with its recorded commands (about 25 min on one core); set "
    "PROCAP_REPRODUCE_TOKENIZER=1 to run",
)
def test_recorded_commands_reproduce_the_tokenizer(tmp_path):
    info = embedded_tokenizer_info()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in info["commands"]:
        words = [w for w in shlex.split(command) if not w.startswith("OMP_NUM_THREADS=")]
        words = [w.replace("runs/demo_tokenizer", str(tmp_path)) for w in words]
        subprocess.run([sys.executable, "-m", "procap", *words[1:]], check=True, env=env)
    vqgan = VQGAN.load(tmp_path / "vqgan" / "vqgan.safetensors")
    data = tmp_path / "data"
    splits = {s: load_split("clevr-change", data, s) for s in ("train", "test")}
    result = probe_tokenizer(vqgan, data, splits["train"], splits["test"])
    for attribute in PROBE_ATTRIBUTES:
        assert result["features"][attribute] == pytest.approx(info["probe"]["features"][attribute], abs=0.03)
