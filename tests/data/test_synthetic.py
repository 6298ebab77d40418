import json

import numpy as np
from PIL import Image

from procap.data.synthetic import generate, render_intermediate


def _read(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_generation_is_deterministic_for_a_seed(tmp_path):
    generate(tmp_path / "a", scenes=6, size=32, seed=5, progress=False)
    generate(tmp_path / "b", scenes=6, size=32, seed=5, progress=False)
    generate(tmp_path / "c", scenes=6, size=32, seed=6, progress=False)
    for name in ("change_captions.json", "splits.json", "type_mapping.json"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    same = _read(tmp_path / "a/images/CLEVR_default_000003.png")
    assert np.array_equal(same, _read(tmp_path / "b/images/CLEVR_default_000003.png"))
    assert not np.array_equal(same, _read(tmp_path / "c/images/CLEVR_default_000003.png"))


def test_layout_matches_clevr_change(tmp_path):
    generate(tmp_path, scenes=10, size=32, seed=0, progress=False)
    for sub, name in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
        assert (tmp_path / sub / f"CLEVR_{name}_000009.png").is_file()
    splits = json.loads((tmp_path / "splits.json").read_text())
    assert sorted(i for v in splits.values() for i in v) == list(range(10))
    mapping = json.loads((tmp_path / "type_mapping.json").read_text())
    assert set(mapping) == {"color", "material", "add", "drop", "move"}
    assert all(name.endswith(".png") and len(name) == 10 for names in mapping.values() for name in names)
    captions = json.loads((tmp_path / "change_captions.json").read_text())
    assert all(len(v) >= 2 for v in captions.values())


def test_distractor_differs_but_semantic_change_is_visible(tmp_path):
    generate(tmp_path, scenes=5, size=48, seed=1, progress=False)
    before = _read(tmp_path / "images/CLEVR_default_000000.png").astype(int)
    after = _read(tmp_path / "sc_images/CLEVR_semantic_000000.png").astype(int)
    distractor = _read(tmp_path / "nsc_images/CLEVR_nonsemantic_000000.png").astype(int)
    assert np.abs(before - after).max() > 25  # a whole object changes
    assert np.abs(before - distractor).mean() > 0


def test_render_intermediate_endpoints_equal_the_images(tmp_path):
    generate(tmp_path, scenes=5, size=32, seed=2, progress=False)
    for index in range(5):
        start, end = render_intermediate(tmp_path, index, 0.0), render_intermediate(tmp_path, index, 1.0)
        assert np.array_equal(start, _read(tmp_path / f"images/CLEVR_default_{index:06d}.png"))
        assert np.array_equal(end, _read(tmp_path / f"sc_images/CLEVR_semantic_{index:06d}.png"))
        middle = render_intermediate(tmp_path, index, 0.5)
        assert middle.shape == start.shape and not np.array_equal(middle, start)
