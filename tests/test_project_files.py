"""What a newcomer looks for at the top of the repository: the licence, how to cite, the torch.hub entry points and
the distribution's metadata, each checked against what the code says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import procap
from procap.data import Vocabulary
from procap.model.pretrained import AUTHORS_HUB_URL, PAPER_BIBTEX, PAPER_TITLE
from procap.model.procap import ProCap
from tests.support import small_config

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml without a package")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_file_is_the_mit_licence_pyproject_declares():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == {"text": "MIT"}
    assert text.startswith("MIT License\n\nCopyright (c) 2026 ProCap contributors\n")


def test_the_citation_file_names_this_software_and_the_paper():
    text = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in text and f"version: {procap.__version__}" in text
    assert f'title: "{PAPER_TITLE}"' in text and "ICLR 2026" in text


def test_the_readme_cites_the_paper_as_the_model_card_does():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bibtex\n(.*?)\n```", readme, flags=re.DOTALL)
    assert PAPER_BIBTEX in blocks


def test_every_project_url_is_one_the_repository_names():
    # Only addresses the docs already give: no page that may not exist (a PyPI page before the first upload).
    readme = (ROOT / "README.md").read_text()
    assert PROJECT["urls"] == {"Authors' checkpoints": AUTHORS_HUB_URL}
    assert all(url in readme for url in PROJECT["urls"].values())
    assert any(c.startswith("Programming Language :: Python :: 3") for c in PROJECT["classifiers"])


def test_torch_hub_loads_the_pretrained_entry_points_from_a_local_clone(tmp_path):
    torch.manual_seed(0)
    vocab = Vocabulary.build([f"w{i}" for i in range(12)], min_count=1)
    model = ProCap(small_config(vocab_size=len(vocab))).eval()
    folder = model.save_pretrained(tmp_path / "pretrained", vocab)

    loaded = torch.hub.load(str(ROOT), "procap", str(folder), source="local")
    generator = torch.Generator().manual_seed(1)
    before, after = torch.rand(2, 3, 16, 16, generator=generator), torch.rand(2, 3, 16, 16, generator=generator)
    assert torch.equal(loaded.generate(before, after), model.generate(before, after))
    captioner = torch.hub.load(str(ROOT), "captioner", str(folder), source="local", device="cpu", dtype="fp32")
    assert torch.equal(captioner.generate(before, after), model.generate(before, after))
