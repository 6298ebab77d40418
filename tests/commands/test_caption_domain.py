"""`procap caption` over a folder of mixed sizes: one warning line that counts and names the far pairs of the whole
folder, not of the first batch that held one."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from procap.data.domain import TRAINED_ON, domain_record
from tests.support import SIZE, run_caption

# pair name -> (width, height) of both of its images; the tiny model of tests/conftest.py takes SIZE px scenes
SIZES = {
    "a.png": (SIZE, SIZE),
    "b.png": (640, 480),
    "c.png": (SIZE, SIZE),
    "d.png": (1000, 800),
    "e.png": (640, 480),
    "f.png": (200, 150),
    "g.png": (SIZE, SIZE),
}


@pytest.fixture(scope="module")
def synthetic_checkpoint(tmp_path_factory, trained, vocab):
    """The tiny model saved as one trained on SIZE px synthetic scenes."""
    from procap.loading.checkpoint import save_checkpoint

    record = domain_record(
        dataset="clevr-change", synthetic=True, image_size=SIZE, source_image_size=(SIZE, SIZE), preset="tiny"
    )
    path = tmp_path_factory.mktemp("domain") / "synthetic.safetensors"
    save_checkpoint(path, trained[0], vocab, {"stage": "stage2", TRAINED_ON: record})
    return path


def _folders(root):
    rng = np.random.default_rng(0)
    for side in ("before", "after"):
        (root / side).mkdir()
        for name, (width, height) in SIZES.items():
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(root / side / name)
    return root / "before", root / "after"


def test_a_folder_of_mixed_sizes_is_one_warning_naming_the_far_pairs(synthetic_checkpoint, tmp_path, capsys):
    before_dir, after_dir = _folders(tmp_path)
    # batches of 2: the first far pair is in the first batch, the others after it
    assert run_caption(synthetic_checkpoint, "--before-dir", str(before_dir), "--after-dir", str(after_dir)) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == len(SIZES)  # every pair captioned all the same
    warned = [line for line in captured.err.splitlines() if line.startswith("procap: warning: ")]
    assert len(warned) == 1, captured.err
    far = [name for name, size in SIZES.items() if size != (SIZE, SIZE)]
    assert warned[0].startswith(f"procap: warning: {len(far)} of the {len(SIZES)} pairs are far from what this model")
    assert ", with images of 3 sizes from 200 x 150 to 1000 x 800 px: " in warned[0]
    named = [f"{before_dir / name} -> {after_dir / name} ({SIZES[name][0]} x {SIZES[name][1]} px)" for name in far]
    assert ", ".join(named[:3]) + f" and {len(far) - 3} more;" in warned[0]


def test_in_domain_pairs_say_nothing(synthetic_checkpoint, folders, capsys):
    before_dir, after_dir = folders
    argv = ["--before-dir", str(before_dir), "--after-dir", str(after_dir), "--no-progress"]
    assert run_caption(synthetic_checkpoint, *argv) == 0
    assert capsys.readouterr().err == ""
