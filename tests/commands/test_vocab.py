"""`procap vocab`: the dataset's min_count from the registry, --min-count overriding it."""

from __future__ import annotations

import json

from procap.commands.cli import main
from procap.data import DATASETS, Vocabulary


def _edit_root(tmp_path):
    """Image-Editing-Request train.json where 'brighter' occurs 4 times and 'darker' once."""
    sents = ["make it brighter"] * 4 + ["make it darker"]
    entries = [
        {"img0": f"{i}a.png", "img1": f"{i}b.png", "sents": [s], "uid": f"Reddit_{i}"} for i, s in enumerate(sents)
    ]
    root = tmp_path / "data"  # the vocabulary goes beside the dataset: a command never writes into what it reads
    root.mkdir()
    (root / "train.json").write_text(json.dumps(entries))
    return root


def test_image_editing_request_uses_the_registry_min_count(tmp_path, capsys):
    root = _edit_root(tmp_path)
    assert DATASETS["image-editing-request"].min_count == 4
    out = tmp_path / "vocab.json"
    assert main(["vocab", "--dataset", "image-editing-request", "--root", str(root), "--out", str(out)]) == 0
    vocab = Vocabulary.load(out)
    assert "brighter" in vocab and "darker" not in vocab
    assert "min count 4" in capsys.readouterr().out


def test_min_count_flag_overrides(tmp_path):
    root = _edit_root(tmp_path)
    out = tmp_path / "vocab.json"
    argv = ["vocab", "--dataset", "image-editing-request", "--root", str(root), "--out", str(out), "--min-count", "1"]
    assert main(argv) == 0
    assert "darker" in Vocabulary.load(out)


def test_training_builds_the_same_vocabulary(tmp_path):
    from procap.data import load_split
    from procap.train.common import build_vocab

    root = _edit_root(tmp_path)
    out = tmp_path / "vocab.json"
    assert main(["vocab", "--dataset", "image-editing-request", "--root", str(root), "--out", str(out)]) == 0
    pairs = load_split("image-editing-request", root, "train")
    assert build_vocab(pairs, "image-editing-request").to_dict() == Vocabulary.load(out).to_dict()
