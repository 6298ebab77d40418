"""One argument list for loading a pretrained model (issue 49, item 6): ProCap.from_pretrained,
Captioner.from_pretrained, load_pretrained and the torch.hub entry points all take the fields of
procap.core.hub_files.PretrainedSource, so an option added there reaches every one of them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from procap.core.hub_files import PretrainedSource

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {
    "revision": "v1",
    "cache_dir": "hub-cache",
    "local_files_only": True,
    "token": "secret",
    "force_download": True,
}


def _hubconf():
    spec = importlib.util.spec_from_file_location("hubconf_under_test", ROOT / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_are_the_source_fields():
    assert {f.name for f in dataclasses.fields(PretrainedSource)} == {"name_or_path", *OPTIONS}
    source, rest = PretrainedSource.split("you/model", {**OPTIONS, "num_beams": 3})
    assert source == PretrainedSource("you/model", **OPTIONS) and rest == {"num_beams": 3}


@pytest.fixture()
def seen(monkeypatch):
    """Every source an entry point resolves, stopped right there (nothing is read or downloaded)."""
    sources: list[PretrainedSource] = []

    class Stop(Exception):
        pass

    def resolve(self, what="pretrained model"):
        sources.append(self)
        raise Stop

    monkeypatch.setattr(PretrainedSource, "resolve", resolve)
    return sources, Stop


def test_every_entry_point_passes_the_same_source(seen):
    from procap.fast import Captioner
    from procap.loading.hub import load_pretrained
    from procap.model.procap import ProCap

    sources, stop = seen
    hubconf = _hubconf()
    calls = [
        lambda: ProCap.from_pretrained("you/model", map_location="cpu", **OPTIONS),
        lambda: Captioner.from_pretrained("you/model", device="cpu", num_beams=2, **OPTIONS),
        lambda: load_pretrained("you/model", **OPTIONS),
        lambda: load_pretrained(PretrainedSource("you/model", **OPTIONS)),
        lambda: hubconf.procap("you/model", **OPTIONS),
        lambda: hubconf.captioner("you/model", device="cpu", **OPTIONS),
    ]
    for call in calls:
        with pytest.raises(stop):
            call()
    assert sources == [PretrainedSource("you/model", **OPTIONS)] * len(calls)


def test_an_unknown_option_is_refused_before_any_read(seen):
    from procap.model.procap import ProCap

    with pytest.raises(TypeError, match="revison"):
        ProCap.from_pretrained("you/model", revison="v1")
    assert seen[0] == []
