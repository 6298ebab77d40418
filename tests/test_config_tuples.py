"""The configs' fixed-length number tuples: read back from JSON lists they compare equal, and a wrong length is
refused when the config is built, naming the field, rather than at first use deep in the model."""

from __future__ import annotations

import dataclasses
import json

import pytest

from procap.core.config import MaskingConfig, get_preset


def test_lists_from_json_become_the_same_tuples():
    written = MaskingConfig(scheme_probs=(0.1, 0.5, 0.2, 0.2), patch_prob_range=(0.2, 0.5))
    read_back = MaskingConfig(**json.loads(json.dumps(dataclasses.asdict(written))))
    assert read_back == written
    assert isinstance(read_back.block_aspect_range, tuple)
    assert all(isinstance(p, float) for p in read_back.scheme_probs)
    config = get_preset("tiny", negative_probs=[1, 0, 0, 0])
    assert config.negative_probs == (1.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("patch_prob_range", (0.1, 0.2, 0.3)),
        ("block_area_range", (0.5,)),
        ("block_aspect_range", ()),
        ("scheme_probs", (0.5, 0.5)),
    ],
)
def test_a_masking_tuple_of_another_length_is_refused(field, value):
    with pytest.raises(ValueError, match=f"masking {field} must be"):
        MaskingConfig(**{field: value})


def test_negative_probs_of_another_length_are_refused():
    with pytest.raises(ValueError, match="negative_probs must be 4 numbers"):
        get_preset("tiny", negative_probs=(0.5, 0.5))


def test_scheme_probs_must_still_sum_to_one():
    with pytest.raises(ValueError, match="summing to 1"):
        MaskingConfig(scheme_probs=(0.5, 0.5, 0.5, 0.5))
