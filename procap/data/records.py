"""The common record every loader returns, and the JSON reader all data files go through (writes: procap.files)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procap.errors import ProCapError
from procap.validate import input_file


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


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing an object that names a key twice (``json`` keeps the last silently)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Load a JSON file; a missing or malformed file, or an object naming one key twice (an id with two captions,
    a split listed twice), becomes a one-sentence ProCapError naming it."""
    path = input_file(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ProCapError(f"{what} {path} names the key {exc.key!r} twice; each id may appear once.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProCapError(f"{what} {path} is not valid JSON ({exc}).") from None
    except RecursionError:
        raise ProCapError(f"{what} {path} is nested too deeply to be read as JSON.") from None
    except OSError as exc:
        raise ProCapError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
