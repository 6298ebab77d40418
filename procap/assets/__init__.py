"""Files shipped inside the package: the demo's tokenizer (procap.train.tokenizer)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEMO_TOKENIZER = "demo_tokenizer.safetensors"


def demo_tokenizer_path() -> Path:
    """Path of the tokenizer shipped in the installed package (the ``tiny`` preset's VQGAN, fitted by the demo)."""
    return Path(str(resources.files("procap.assets").joinpath(DEMO_TOKENIZER)))
