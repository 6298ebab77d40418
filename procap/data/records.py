"""The common record every loader returns (data files are read by :func:`procap.core.json_files.read_json`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ChangePair:
    """One (before, after) image pair with its reference captions.

    Attributes:
        id: the pair's id: the after image's file name for CLEVR-Change, `img_id` for Spot-the-Diff,
            `uid` for Image-Editing-Request.
        before_path: the before image.
        after_path: the after image.
        captions: reference captions (raw text; tokenisation happens in `Vocabulary`).
        change_type: color/material/add/drop/move or "no_change" for CLEVR-Change, "change" / "no_change" for
            LEVIR-CC (its ``changeflag``), else None.
    """

    id: str
    before_path: Path
    after_path: Path
    captions: list[str]
    change_type: str | None = None
