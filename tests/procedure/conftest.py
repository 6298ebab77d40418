"""Fixtures for the procedure tests: tiny PNG pairs in CLEVR-Change naming."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import save_png, square_image


@pytest.fixture
def clevr_pairs(tmp_path):
    """Six CLEVR-named pairs (three scenes x change/distractor) of moving squares, as PNG files."""
    pairs = []
    for i in range(3):
        before = tmp_path / f"CLEVR_default_{i:06d}.png"
        save_png(square_image(8 + i, 10), before)
        for kind, dx in (("semantic", 12), ("nonsemantic", 1)):
            after = tmp_path / f"CLEVR_{kind}_{i:06d}.png"
            save_png(square_image(8 + i + dx, 10 + dx // 2), after)
            pairs.append(SimpleNamespace(id=after.name, before_path=before, after_path=after, captions=["c"]))
    return pairs
