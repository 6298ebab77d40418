"""procap.eval.split.caption_pairs and evaluate_model show their progress bar only when asked (workers of `procap
demo` train quietly, and the demo evaluates quietly under --no-progress)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support import small_config, write_image

from procap.data.images import ImageCache
from procap.data.vocab import Vocabulary
from procap.eval.split import caption_pairs, evaluate_model
from procap.model.procap import ProCap


@pytest.mark.parametrize("evaluate", [False, True])
@pytest.mark.parametrize("progress", [True, False])
def test_caption_bar_follows_progress(tmp_path, capsys, progress, evaluate):
    vocab = Vocabulary.build(["the small red cube moved", "no change"])
    model = ProCap(small_config(vocab_size=len(vocab))).eval()
    pairs = []
    for index in range(4):
        before, after = tmp_path / f"{index}_a.png", tmp_path / f"{index}_b.png"
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
    if evaluate:
        report = evaluate_model(
            model, vocab, pairs, metrics=["BLEU-4"], batch_size=2, cache=ImageCache(16), progress=progress
        )
        captions = report["predictions"]
    else:
        captions, _ = caption_pairs(model, vocab, pairs, batch_size=2, cache=ImageCache(16), progress=progress)
    assert sorted(captions) == [p.id for p in pairs]
    assert ("caption" in capsys.readouterr().err) == progress
