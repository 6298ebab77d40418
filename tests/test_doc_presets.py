"""docs/model.md's preset table against the presets themselves: layers, widths, latents and every parameter count, so a
changed preset fails here until the table is regenerated from ``procap info``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from procap.core.config import PRESETS, get_preset
from procap.model.procap import ProCap, count_parameters

MODEL_DOC = Path(__file__).resolve().parents[1] / "docs" / "model.md"
ROW = re.compile(
    r"^\| `(?P<name>[a-z0-9-]+)` \| (?P<k>\d+) \| (?P<encoder>[^|]+) \| (?P<decoder>[^|]+) \| (?P<vqgan>[^|]+) \| (?P<total>[^|]+) \|$"
)


def preset_rows() -> dict[str, dict[str, str]]:
    text = MODEL_DOC.read_text(encoding="utf-8")
    table = text[text.index("| preset | k | encoder | decoder | VQGAN | total parameters |") :].split("\n\n")[0]
    return {m["name"]: m.groupdict() for m in map(ROW.match, table.splitlines()) if m}


def millions(count: int) -> str:
    """How ``procap info`` prints a count."""
    return f"{count / 1e6:.2f} M"


def test_the_table_has_a_row_for_every_preset():
    assert sorted(preset_rows()) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_row_states_the_counted_parameters_of_its_preset(name):
    row = preset_rows()[name]
    config = get_preset(name)
    with torch.device("meta"):  # shapes only: counting needs no memory
        counts = count_parameters(ProCap(config))
    assert int(row["k"]) == config.num_keyframes
    assert row["encoder"] == f"{config.enc_layers} × {config.enc_dim} ({millions(counts['encoder'])})"
    assert row["decoder"] == f"{config.dec_layers} × {config.dec_dim} ({millions(counts['decoder'])})"
    assert row["vqgan"].startswith(millions(counts["vqgan"]))
    if "latents" in row["vqgan"]:
        side = config.latent_size
        assert f"{config.image_size} px, {side}×{side} latents" in row["vqgan"]
    assert row["total"] == millions(counts["total"])
