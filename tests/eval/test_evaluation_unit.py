"""``evaluate``'s results.json, references.json and metrics.json are one unit (issue 48, class A): a full disk at
metrics.json left new predictions beside the old scores."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest
from support import small_config, write_image

from procap.core.files import OutputError
from procap.data.images import ImageCache
from procap.data.vocab import Vocabulary
from procap.eval import split
from procap.model.procap import ProCap


def _pairs(folder, count: int) -> list[SimpleNamespace]:
    pairs = []
    for index in range(count):
        before, after = folder / f"{index}_a.png", folder / f"{index}_b.png"
        write_image(before, 2 * index, size=16)
        write_image(after, 2 * index + 1, size=16)
        pairs.append(
            SimpleNamespace(
                id=f"{index}.png",
                before_path=str(before),
                after_path=str(after),
                captions=["no change"],
                change_type=None,
            )
        )
    return pairs


def _files(out) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.iterdir())}


def test_a_full_disk_at_the_scores_leaves_the_previous_evaluation_whole(tmp_path, monkeypatch):
    vocab = Vocabulary.build(["the small red cube moved", "no change"])
    model = ProCap(small_config(vocab_size=len(vocab))).eval()
    pairs, out = _pairs(tmp_path, 4), tmp_path / "eval"

    def evaluate(chosen):
        return split.evaluate_model(
            model, vocab, chosen, ["BLEU-4"], 2, cache=ImageCache(16), out=out, progress=False, references=True
        )

    evaluate(pairs)
    previous = _files(out)
    assert sorted(previous) == ["metrics.json", "references.json", "results.json"]

    write_json = split.atomic_write_json

    def disk_full_at_the_scores(path, obj, indent=None):
        if os.path.basename(path) == "metrics.json":
            raise OutputError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write_json(path, obj, indent=indent)

    monkeypatch.setattr(split, "atomic_write_json", disk_full_at_the_scores)
    with pytest.raises(OutputError) as failed:
        evaluate(pairs[:3])  # other predictions: a mixed folder would show
    assert failed.value.filename == str(out / "metrics.json")  # the file the user knows, not the staging folder
    assert _files(out) == previous  # nothing new beside the old scores, and nothing left beside them

    monkeypatch.undo()
    evaluate(pairs[:3])
    assert sorted(_files(out)) == sorted(previous) and _files(out) != previous
