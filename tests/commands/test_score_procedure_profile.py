"""What `procap score`, `procap procedure` and `procap profile` say: one total row, the pair id wanted when an
image's name is given, and what a profile on a CPU does."""

from __future__ import annotations

import json

import pytest

from procap.commands.cli import main
from procap.data.synthetic import generate

REFS = {
    "a.png": ["the red cube moved", "the red cube changed its location"],
    "b.png": ["the blue sphere was added", "someone added a blue sphere"],
    "c.png": ["no change was made", "nothing has changed"],
}
TYPES = {"a.png": "move", "b.png": "add", "c.png": "no_change"}


def test_score_prints_one_total_row_then_the_groups(tmp_path, capsys):
    paths = {}
    for name, content in (("pred", {k: v[0] for k, v in REFS.items()}), ("refs", REFS), ("types", TYPES)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(content))
    argv = ["score", "--pred", str(paths["pred"]), "--refs", str(paths["refs"]), "--types", str(paths["types"])]
    assert main([*argv, "--metrics", "bleu", "--out", str(tmp_path / "scores.json")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[0] for row in rows] == ["total", "add", "change", "move", "no_change"]
    written = json.loads((tmp_path / "scores.json").read_text())
    assert [float(v) for v in rows[0][1:]] == [round(written[f"BLEU-{n}"], 1) for n in range(1, 5)]
    assert written["by_type"]["total"]["BLEU-4"] == written["BLEU-4"]  # the row shown once is both


def test_score_without_types_is_one_total_row(tmp_path, capsys):
    (tmp_path / "pred.json").write_text(json.dumps({k: v[0] for k, v in REFS.items()}))
    (tmp_path / "refs.json").write_text(json.dumps(REFS))
    argv = ["score", "--pred", str(tmp_path / "pred.json"), "--refs", str(tmp_path / "refs.json"), "--metrics", "bleu"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ["total"]  # then the JSON line


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("procedure")
    generate(root / "data", 2, size=16, seed=0, workers=1, progress=False)
    (root / "vqgan.safetensors").write_bytes(b"")  # never read: the pair is looked up first
    return root


def _procedure(scenes, pair: str) -> int:
    argv = ["procedure", "--data", str(scenes / "data"), "--pair", pair, "--vqgan", str(scenes / "vqgan.safetensors")]
    return main([*argv, "--out", str(scenes / "strip.png")])


def test_procedure_given_a_before_image_names_the_pair_ids_wanted(scenes, capsys):
    assert _procedure(scenes, "CLEVR_default_000001.png") == 2
    err = capsys.readouterr().err
    assert err == (
        "procap: error: --pair CLEVR_default_000001.png is the before image of CLEVR_semantic_000001.png and "
        "CLEVR_nonsemantic_000001.png; a clevr-change pair is named by the after image's file name: give --pair "
        "CLEVR_semantic_000001.png or --pair CLEVR_nonsemantic_000001.png.\n"
    )


def test_procedure_given_an_unknown_name_says_no_split_lists_it(scenes, capsys):
    assert _procedure(scenes, "CLEVR_default_000009.png") == 2
    assert "is not a pair of clevr-change in" in capsys.readouterr().err


def test_profile_on_a_cpu_says_what_it_does_there(checkpoint, tmp_path, capsys):
    argv = ["profile", "--ckpt", str(checkpoint), "--batch-size", "2", "--steps", "1", "--max-len", "6"]
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path / "prof")]) == 0
    printed = capsys.readouterr().out
    assert "replayed graph" not in printed
    assert "the trace shows the pipeline as the CPU runs it" in printed and "on a machine with a GPU" in printed
    nsight = [line for line in printed.splitlines() if line.startswith(("nsys:", "ncu:", "ncu-encoder:"))]
    assert len(nsight) == 3 and all("--device" not in line for line in nsight)  # a CPU device profiles no kernel


def test_profile_of_a_preset_with_random_weights_runs_on_a_cpu(tmp_path, capsys):
    argv = ["profile", "--preset", "tiny", "--batch-size", "1", "--steps", "1", "--max-len", "4", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "prof")]) == 0
    printed = capsys.readouterr().out
    assert len(list((tmp_path / "prof").glob("procap_trace_*.json"))) == 1
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in printed.splitlines() if line.startswith("n")}
    assert set(lines) >= {"nsys", "ncu", "ncu-encoder"}
    for tool in ("ncu", "ncu-encoder"):  # ncu at the clocks the timed runs have, the same random-weight workload
        assert "--clock-control none" in lines[tool] and "--preset tiny" in lines[tool] and "--ckpt" not in lines[tool]
        assert lines[tool].endswith("--no-graphs")
    assert "--nvtx-include procap.decode/" in lines["ncu"]
    assert "--nvtx-include procap.vqgan/ --nvtx-include procap.encoder/" in lines["ncu-encoder"]


@pytest.mark.parametrize("model", [[], ["--ckpt", "model.safetensors", "--preset", "tiny"]], ids=["neither", "both"])
def test_profile_takes_a_checkpoint_or_a_preset(model, capsys):
    assert main(["profile", *model, "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "procap: error: give --ckpt CHECKPOINT or --preset NAME (random weights), exactly one of them.\n"
    )
