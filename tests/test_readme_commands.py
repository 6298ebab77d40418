"""The `prepare` / `evaluate` / `score` block of docs/commands.md (the command reference the README points to) runs as
written (flags given or working defaults), and the README says what a newcomer needs said.

The block assumes the output of `procap demo --quick --out runs/demo`; a tiny stand-in with the same layout (the
synthetic benchmark at 16 px, a one-layer model and a small VQGAN) takes its place, so the commands run in seconds.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from procap.commands.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMANDS_DOC = ROOT / "docs" / "commands.md"
TINY_MODEL = {
    "max_caption_len": 8,
    "num_keyframes": 1,
    "enc_dim": 16,
    "enc_heads": 2,
    "enc_mlp": 32,
    "enc_layers": 1,
    "dropout": 0.0,
}
TINY_MODEL |= {"dec_dim": 16, "dec_heads": 2, "dec_ffn": 32, "dec_layers": 1}


def _tiny_vqgan():
    from tests.support import small_vqgan_config

    return small_vqgan_config(resolution=16, ch_mult=(1, 2), attn_resolutions=(), embed_dim=8, n_embed=32)


def _after_demo_block() -> list[list[str]]:
    """The argv of every `procap` line in docs/commands.md's block that follows 'these run as written'."""
    text = COMMANDS_DOC.read_text(encoding="utf-8")
    match = re.search(r"these run as written.*?```bash\n(.*?)```", text, flags=re.DOTALL)
    assert match, "docs/commands.md lost the block of commands that run as written after the quick demo"
    lines = [line.split("#")[0].strip() for line in match.group(1).splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("procap ")]


def _demo_layout(root: Path) -> None:
    """runs/demo/{data, vqgan/vqgan.safetensors, procap/best.safetensors} as `procap demo` writes them."""
    from procap.core.config import get_preset
    from procap.data import load_split
    from procap.data.synthetic import generate
    from procap.loading.checkpoint import save_checkpoint
    from procap.model.procap import ProCap
    from procap.train.common import build_vocab
    from procap.train.vqgan_train import save_vqgan

    demo = root / "runs" / "demo"
    generate(demo / "data", 12, size=16, seed=5, progress=False)
    vocab = build_vocab(load_split("clevr-change", demo / "data", "train"), "clevr-change")
    model = ProCap(get_preset("tiny", vqgan=_tiny_vqgan(), image_size=16, vocab_size=len(vocab), **TINY_MODEL))
    save_checkpoint(demo / "procap" / "best.safetensors", model, vocab)
    save_vqgan(demo / "vqgan" / "vqgan.safetensors", model.vqgan)


def test_the_after_demo_block_runs_as_written(tmp_path, monkeypatch, capsys):
    commands = _after_demo_block()
    assert [argv[0] for argv in commands] == ["prepare", "evaluate", "score", "score"]  # --dataset, then --refs
    _demo_layout(tmp_path)
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        code = main(argv)
        assert code == 0, (argv, capsys.readouterr().err)
    assert (tmp_path / "runs" / "cache" / "sc_videos.h5").is_file()
    assert (tmp_path / "runs" / "eval" / "results.json").is_file()
    assert (tmp_path / "runs" / "eval" / "references.json").is_file()  # written by evaluate, read by score --refs

    # docs/pretrained.md's example saves the demo's model with the scores this evaluation wrote
    exec(compile(_pretrained_save_example(), "docs/pretrained.md", "exec"), {})  # noqa: S102 - the repository's own docs, under test
    card = (tmp_path / "procap-synthetic-demo" / "README.md").read_text(encoding="utf-8")
    scores = json.loads((tmp_path / "runs" / "eval" / "metrics.json").read_text(encoding="utf-8"))["metrics"]
    assert f"| CIDEr | {scores['CIDEr']:.4g} |" in card
    assert "synthetic CLEVR-Change (procap synth)." in card


def _pretrained_save_example() -> str:
    """docs/pretrained.md's first Python block up to its Hub upload (the lines that run offline)."""
    text = (ROOT / "docs" / "pretrained.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert block, "docs/pretrained.md lost its save_pretrained example"
    lines = block.group(1).splitlines()
    upload = next(i for i, line in enumerate(lines) if ".push_to_hub(" in line)
    return "\n".join(lines[:upload])


@pytest.mark.parametrize("phrase", ["download.pytorch.org/whl/cpu"])
def test_the_readme_says_how_to_get_the_cpu_wheel(phrase):
    assert phrase in README.read_text(encoding="utf-8")


def test_the_readme_gives_one_time_for_the_quick_demo():
    lines = [line for line in README.read_text(encoding="utf-8").splitlines() if "demo --quick" in line]
    timed = [line for line in lines if re.search(r"\d+\s*(min|s\b|seconds|minutes)", line)]
    assert len(timed) == 1, timed
