"""`procap caption` and `procap profile` on a saved tiny checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from procap.commands.cli import main


@pytest.fixture()
def image_files(tmp_path, pairs):
    """Three (before, after) PNG pairs and the exact tensors they decode to: paths, (3, 3, 32, 32) x 2."""
    paths, tensors = [], ([], [])
    for i in range(3):
        for side, batch in enumerate(pairs):
            array = (batch[i].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            path = tmp_path / f"{i}_{side}.png"
            Image.fromarray(array).save(path)
            paths.append(str(path))
            tensors[side].append(torch.from_numpy(np.asarray(array)).permute(2, 0, 1).float() / 255)
    return paths, torch.stack(tensors[0]), torch.stack(tensors[1])


def _expected(trained, vocab, before, after):
    return [vocab.decode(row) for row in trained[0].generate(before, after, max_len=16).tolist()]


def test_caption_prints_one_caption_per_pair(checkpoint, image_files, trained, vocab, capsys):
    paths, before, after = image_files
    assert main(["caption", "--ckpt", str(checkpoint), *paths, "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == _expected(trained, vocab, before, after)


def test_caption_json(checkpoint, image_files, trained, vocab, capsys):
    paths, before, after = image_files
    assert main(["caption", "--ckpt", str(checkpoint), *paths[:2], "--json", "--dtype", "fp32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == [{"before": paths[0], "after": paths[1], "caption": _expected(trained, vocab, before, after)[0]}]


def test_caption_samples_reproducibly_by_seed(checkpoint, image_files, trained, vocab, capsys):
    paths, before, after = image_files
    argv = ["caption", "--ckpt", str(checkpoint), *paths, "--device", "cpu", "--strategy", "sample", "--top-k", "5"]
    runs = []
    for seed in ("4", "4", "5"):
        assert main([*argv, "--seed", seed]) == 0
        runs.append(capsys.readouterr().out.splitlines())
    tokens = trained[0].generate(before, after, 16, strategy="sample", strategy_options={"top_k": 5, "seed": 4})
    assert runs[0] == runs[1] == [vocab.decode(row) for row in tokens.tolist()]
    assert runs[2] != runs[0]


@pytest.mark.parametrize(
    "case,message",
    [
        ("odd", "odd number of paths"),
        ("missing", "does not exist"),
        ("ckpt", "does not exist"),
        ("device", "no CUDA device"),
    ],
)
def test_caption_bad_input_exits_2(checkpoint, image_files, tmp_path, capsys, case, message):
    paths = image_files[0]
    args = {
        "odd": [*paths[:3]],
        "missing": [paths[0], str(tmp_path / "nope.png")],
        "ckpt": paths[:2],
        "device": paths[:2],
    }[case]
    ckpt = str(tmp_path / "missing.safetensors") if case == "ckpt" else str(checkpoint)
    extra = ["--device", "cuda"] if case == "device" else []
    if case == "device" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(["caption", "--ckpt", ckpt, *args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error:") and message in err


@pytest.mark.parametrize("configure_as", [None, "cuda"])
def test_profile_writes_trace_and_prints_nsight_commands(checkpoint, tmp_path, capsys, monkeypatch, configure_as):
    # "cuda": the Captioner as a GPU configures it; the trace must still profile the uncaptured pipeline, whose
    # ranges a replayed whole-pipeline graph would hide.
    from procap.fast import Captioner

    built = []
    load = Captioner.from_checkpoint.__func__

    def from_checkpoint(cls, *args, **kwargs):
        built.append(load(cls, *args, configure_as=configure_as, **kwargs))
        return built[-1]

    monkeypatch.setattr(Captioner, "from_checkpoint", classmethod(from_checkpoint))
    out_dir = tmp_path / "prof"
    assert (
        main(
            [
                "profile",
                "--ckpt",
                str(checkpoint),
                "--batch-size",
                "2",
                "--steps",
                "1",
                "--out",
                str(out_dir),
                "--max-len",
                "6",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    traces = list(out_dir.glob("procap_trace_*.json"))
    assert len(traces) == 1 and not list(out_dir.glob(".*tmp"))
    names = {event.get("name") for event in json.loads(traces[0].read_text())["traceEvents"]}
    assert {"procap.vqgan", "procap.encoder", "procap.prefill", "procap.decode"} <= names
    assert "nsys profile" in printed and "ncu " in printed and "--no-trace" in printed
    assert built and not built[0].use_graphs and not built[0].capture_memory
    ncu = next(line for line in printed.splitlines() if line.startswith("ncu:"))
    assert ncu.endswith("--no-graphs")  # its NVTX filter needs the ranges of the uncaptured loop
