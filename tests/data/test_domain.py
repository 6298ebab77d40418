"""The out-of-domain rule of ``procap.data.domain``: which pairs are far, and the one sentence that names them."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from procap.data.domain import (
    SHOWN_PAIRS,
    PairFacts,
    camera_name,
    domain_problem,
    domain_record,
    image_facts,
    pair_facts,
)

SYNTHETIC_64 = domain_record(
    dataset="clevr-change", synthetic=True, data="runs/demo/data", image_size=64, source_image_size=(64, 64)
)
# the real CLEVR-Change at the paper's 224 px input: its images are 480 x 320
REAL_224 = domain_record(dataset="clevr-change", synthetic=False, image_size=224, source_image_size=(480, 320))


def _pair(size, camera=None, name="before.png -> after.png", after=None) -> PairFacts:
    return PairFacts(name, (size, camera), (after or size, None))


def _png(path, width: int, height: int):
    Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8)).save(path)
    return path


def _jpeg(path, make: str, model: str):
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = make, model
    Image.fromarray(np.full((64, 64, 3), 120, dtype=np.uint8)).save(path, exif=exif)
    return path


# -- the rule --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "size", "far"),
    [
        (SYNTHETIC_64, (640, 480), True),
        (SYNTHETIC_64, (64, 64), False),
        (SYNTHETIC_64, (128, 128), False),  # within the factor of 2
        (SYNTHETIC_64, (129, 64), True),
        (SYNTHETIC_64, (31, 64), True),
        (REAL_224, (480, 320), False),  # the benchmark's own images
        (REAL_224, (224, 224), False),  # frames already at the model's input size
        (REAL_224, (640, 480), False),
        (REAL_224, (4032, 3024), True),  # a phone's photograph
        (None, (4032, 3024), False),  # no record: unknown, never said
        (domain_record(image_size=224), (4032, 3024), False),  # a record without the training images' size
        (SYNTHETIC_64, (0, 0), False),  # no pixels, no ratio: loading the image refuses it
        (SYNTHETIC_64, (0, 64), False),
    ],
)
def test_the_size_rule(record, size, far):
    assert (domain_problem(record, [_pair(size)]) is not None) is far


def test_a_camera_makes_a_photograph_for_a_synthetic_model_only():
    problem = domain_problem(SYNTHETIC_64, [_pair((64, 64), "Canon EOS 5D")])
    assert problem is not None and "(taken with a Canon EOS 5D)" in problem
    assert domain_problem(REAL_224, [_pair((480, 320), "Canon EOS 5D")]) is None


# -- the sentence ----------------------------------------------------------------------------------------------
def test_one_pair_is_named_with_its_size():
    problem = domain_problem(SYNTHETIC_64, [_pair((640, 480), name="shots/a.png -> shots/b.png")])
    assert problem.startswith("the pair shots/a.png -> shots/b.png (640 x 480 px) is far from what this model was ")
    assert "(synthetic CLEVR-Change (procap synth), 64 x 64 px images, model input 64 px)" in problem
    assert problem.count(";") == 1 and problem.endswith("(README: Caption your own images).")


def test_a_pair_given_as_pixels_is_the_pair_given():
    assert domain_problem(SYNTHETIC_64, [_pair((640, 480), name=None)]).startswith("the pair given (640 x 480 px)")


def test_the_far_pairs_of_many_are_named_and_counted():
    pairs = [_pair((64, 64), name=f"b{i}.png -> a{i}.png") for i in range(10)]
    pairs[2] = _pair((640, 480), name="b2.png -> a2.png")
    pairs[7] = _pair((640, 480), name="b7.png -> a7.png")
    problem = domain_problem(SYNTHETIC_64, pairs)
    assert problem.startswith("2 of the 10 pairs are far from what this model was trained on (")
    assert problem.endswith(
        ": b2.png -> a2.png (640 x 480 px), b7.png -> a7.png (640 x 480 px); their captions are "
        "guesses, not descriptions (README: Caption your own images)."
    )
    assert "sizes" not in problem  # one far size: nothing mixed to say


def test_a_folder_of_mixed_sizes_says_so_and_names_the_first_pairs():
    sizes = [(640, 480), (64, 64), (4032, 3024), (800, 600), (640, 480), (1024, 768), (64, 64)]
    pairs = [_pair(size, name=f"p{i}.png -> q{i}.png") for i, size in enumerate(sizes)]
    problem = domain_problem(SYNTHETIC_64, pairs)
    far = [i for i, size in enumerate(sizes) if size != (64, 64)]
    assert problem.startswith(f"{len(far)} of the {len(sizes)} pairs are far")
    assert ", with images of 4 sizes from 640 x 480 to 4032 x 3024 px: " in problem
    named = re.findall(r"p(\d)\.png -> q\d\.png \(([^)]*)\)", problem)
    assert [(int(i), why) for i, why in named] == [(i, f"{sizes[i][0]} x {sizes[i][1]} px") for i in far[:SHOWN_PAIRS]]
    assert f" and {len(far) - SHOWN_PAIRS} more;" in problem


def test_unnamed_pairs_are_numbered_and_a_pair_of_two_far_sizes_gives_both():
    pairs = [_pair((64, 64), name=None), _pair((640, 480), name=None, after=(200, 200))]
    problem = domain_problem(SYNTHETIC_64, pairs)
    assert ": pair 2 (640 x 480 px, 200 x 200 px);" in problem


def test_in_domain_and_identical_pairs_say_nothing():
    assert domain_problem(SYNTHETIC_64, [_pair((64, 64)), _pair((128, 96))]) is None
    assert domain_problem(SYNTHETIC_64, []) is None


# -- what the rule is given ------------------------------------------------------------------------------------
def test_pair_facts_name_files_by_their_paths_and_pixels_by_nothing(tmp_path):
    before, after = _png(tmp_path / "b.png", 640, 480), _png(tmp_path / "a.png", 64, 64)
    assert (
        pair_facts([before, str(before)], [after, str(after)])
        == [PairFacts(f"{before} -> {after}", ((640, 480), None), ((64, 64), None))] * 2
    )
    assert pair_facts(before, after)[0].name == f"{before} -> {after}"  # one pair, not a list
    tensors = pair_facts(torch.rand(2, 3, 48, 40), torch.rand(2, 3, 48, 40))
    assert [pair.name for pair in tensors] == [None, None] and tensors[0].before == ((40, 48), None)
    assert len(pair_facts([before, before], [after])) == 1  # loading refuses the odd one out


def test_facts_are_read_before_the_resize_from_every_kind_of_input(tmp_path):
    photo = _png(tmp_path / "photo.png", 640, 480)
    array = np.array(Image.open(photo))
    assert image_facts(photo)[0] == image_facts(str(photo))[0] == image_facts(Image.open(photo))[0] == (640, 480)
    assert image_facts(array)[0] == image_facts(torch.from_numpy(array))[0] == (640, 480)
    assert image_facts(torch.rand(3, 480, 640))[0] == (640, 480)
    assert image_facts(tmp_path / "missing.png") == (None, None)  # loading it names what is wrong


@pytest.mark.parametrize(
    ("make", "model", "name"),
    [
        ("Canon", "EOS 5D", "Canon EOS 5D"),
        ("Canon", "Canon EOS 5D", "Canon EOS 5D"),  # the model names its maker: said once
        ("NIKON CORPORATION", "NIKON D750", "NIKON D750"),
        ("Apple", "iPhone 12", "Apple iPhone 12"),
        ("", "EOS 5D", "EOS 5D"),
        ("Canon", "", "Canon"),
        ("", "", None),
    ],
)
def test_the_camera_is_named_once(tmp_path, make, model, name):
    assert camera_name(make, model) == name
    if name is not None:  # and so from a file's EXIF
        assert image_facts(_jpeg(tmp_path / "shot.jpg", make, model)) == ((64, 64), name)
