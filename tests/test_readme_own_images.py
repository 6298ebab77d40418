"""The README's "Caption your own images" commands run as written, on stand-ins.

Route (a) captions with the checkpoint the set-up's `procap demo --quick` already wrote (it must not train the demo
again): a small 64 px model recorded as trained on the synthetic benchmark takes its place, at the path the demo's
default `--out` gives it. Route (b) converts the authors' own reduced-size checkpoint
(`tests/convert/data/clevr_like`), copied to the paths the README names.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from procap.commands.cli import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"


def _section_commands() -> list[list[str]]:
    """The argv of every `procap` line in the bash blocks of the section (continuation lines joined)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"\n## Caption your own images\n(.*?)\n## ", text, flags=re.DOTALL)
    assert match, "README lost its 'Caption your own images' section"
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", match.group(1), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("procap "):
                commands.append(shlex.split(line)[1:])
    return commands


def _demo_stand_in(root: Path) -> None:
    """runs/demo/{data, procap/best.safetensors} as the demo writes them, the model small and untrained."""
    import torch

    from procap.data import load_split
    from procap.data.domain import TRAINED_ON, training_domain
    from procap.data.synthetic import generate
    from procap.loading.checkpoint import save_checkpoint
    from procap.model.procap import ProCap
    from procap.train.common import build_vocab
    from tests.support import small_config, small_vqgan_config

    data = root / "runs" / "demo" / "data"
    generate(data, 10, size=64, seed=0, progress=False)
    pairs = load_split("clevr-change", data, "train")
    vocab = build_vocab(pairs, "clevr-change")
    torch.manual_seed(0)
    model = ProCap(small_config(image_size=64, vqgan=small_vqgan_config(resolution=64), vocab_size=len(vocab)))
    record = training_domain("clevr-change", pairs, 64, "tiny", data)
    save_checkpoint(root / "runs/demo/procap/best.safetensors", model, vocab, {"stage": "stage2", TRAINED_ON: record})


def _photo(path: Path, seed: int) -> None:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(path)


def _run(argv: list[str], capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, (argv, captured.err)
    return captured.err


def test_caption_your_own_images_runs_as_written(tmp_path, monkeypatch, capsys):
    from tests.support import AUTHORS_CHECKPOINT, AUTHORS_VOCAB, authors_image_paths

    commands = _section_commands()
    assert [argv[0] for argv in commands] == ["synth", "caption", "caption", "convert", "caption"]
    synth, scenes, photos, convert, own = commands
    monkeypatch.chdir(tmp_path)

    # the checkpoint route (a) reads is the one `procap demo --quick` writes with its default --out
    demo_out = build_parser().parse_args(["demo", "--quick"]).out
    for caption in (scenes, photos):
        assert caption[caption.index("--ckpt") + 1] == f"{demo_out}/procap/best.safetensors"
    _demo_stand_in(tmp_path)
    _run(synth, capsys)
    assert _run(scenes, capsys) == ""  # 64 x 64 synthetic scenes: in domain, nothing said
    for seed, name in enumerate(photos[-2:]):
        _photo(tmp_path / name, seed)
    warned = _run(photos, capsys).splitlines()
    before, after = photos[-2:]
    assert len(warned) == 1 and warned[0].startswith(
        f"procap: warning: the pair {before} -> {after} (640 x 480 px) is far"
    )

    model_file = Path(convert[convert.index("--from") + 2])
    vocab_file = Path(convert[convert.index("--vocab") + 1])
    for source, target in ((AUTHORS_CHECKPOINT, model_file), (AUTHORS_VOCAB, vocab_file)):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    _run(convert, capsys)
    from procap.data.domain import TRAINED_ON
    from procap.loading.checkpoint import read_checkpoint_metadata

    record = read_checkpoint_metadata(convert[convert.index("--out") + 1])["extra"][TRAINED_ON]
    assert (record["dataset"], record["synthetic"], record["source_image_size"]) == ("clevr-change", False, [480, 320])
    befores, afters = authors_image_paths()  # 224 px CLEVR-Change frames, the size the authors' model takes
    for source, name in ((befores[0], own[-2]), (afters[0], own[-1])):
        shutil.copyfile(source, tmp_path / name)
    assert _run(own, capsys) == ""


def _section_text() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Caption your own images\n")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize("phrase", ["BlueberryOreo/ProCap", "OutOfDomainWarning", "trained_on"])
def test_the_section_says_where_and_what(phrase):
    assert phrase in _section_text()


def test_the_section_does_not_train_the_demo_again():
    # the newcomer has just run the quick demo: a second `procap demo` would replace its runs and take minutes
    assert "procap demo" not in _section_text()
