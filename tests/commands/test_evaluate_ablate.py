"""`procap evaluate --ablate`: the decoder reads a memory without the named parts; misuse is one sentence."""

from __future__ import annotations

import json

import pytest
import torch

from procap.commands.cli import main
from procap.data import load_split
from procap.data.synthetic import generate
from procap.loading.checkpoint import save_checkpoint
from procap.model.procap import ProCap
from procap.train.common import build_vocab
from tests.support import small_config, small_vqgan_config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    generate(root / "data", 12, size=16, seed=0, workers=1)
    vocab = build_vocab(load_split("clevr-change", root / "data", "train"), "clevr-change")
    torch.manual_seed(0)
    naming = small_config(
        vqgan=small_vqgan_config(ch_mult=(1, 2), attn_resolutions=()),
        vocab_size=len(vocab),
        difference_mode="joint",
        token_merge=2,
        change_token=True,
        standardize_features=True,
    )
    stage2_facts = {"step": 37, "stage": "stage2"}
    with_change = save_checkpoint(root / "naming.safetensors", ProCap(naming).eval(), vocab, extra=stage2_facts)
    plain = save_checkpoint(root / "plain.safetensors", ProCap(small_config(vocab_size=len(vocab))).eval(), vocab)
    return root, with_change, plain


def _evaluate(root, ckpt, out, *flags):
    argv = ["evaluate", "--ckpt", str(ckpt), "--data", str(root / "data"), "--metrics", "BLEU-4"]
    return main([*argv, "--out", str(root / out), *flags])


def test_ablation_runs_and_is_recorded(setup):
    root, with_change, _ = setup
    assert _evaluate(root, with_change, "both", "--ablate", "queries", "change") == 0
    report = json.loads((root / "both" / "metrics.json").read_text())
    assert report["ablated"] == ["queries", "change"]
    assert _evaluate(root, with_change, "full") == 0
    assert json.loads((root / "full" / "metrics.json").read_text())["ablated"] == []


def test_metrics_name_the_checkpoint_step(setup):
    root, with_change, plain = setup
    assert _evaluate(root, with_change, "stepped") == 0
    report = json.loads((root / "stepped" / "metrics.json").read_text())
    assert (report["checkpoint_step"], report["checkpoint_stage"]) == (37, "stage2")
    assert _evaluate(root, plain, "unstepped") == 0  # weights saved without training facts
    report = json.loads((root / "unstepped" / "metrics.json").read_text())
    assert (report["checkpoint_step"], report["checkpoint_stage"]) == (None, None)


@pytest.mark.parametrize(
    ("which", "flags", "needle"),
    [
        ("plain", ["--ablate", "change"], "has no change token"),
        ("naming", ["--ablate", "queries", "--fast"], "leave out --fast"),
        ("naming", ["--ablate", "queries", "--beams", "2"], "leave out --fast and --beams"),
    ],
)
def test_ablation_misuse_is_one_sentence(setup, capsys, which, flags, needle):
    root, with_change, plain = setup
    ckpt = plain if which == "plain" else with_change
    assert _evaluate(root, ckpt, f"bad_{which}", *flags) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
