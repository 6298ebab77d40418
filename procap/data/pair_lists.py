"""Image pairs to caption, named by a list file or by two folders (``procap caption --pairs`` / ``--before-dir``).

A list is a CSV file with ``before`` and ``after`` columns or a JSON Lines file of ``{"before": ..., "after": ...}``
objects (:func:`read_rows`, the reader of caption files too); relative paths are read against the list file's
folder, so a list travels with its images. Two folders
pair the images of the same file name. Every image is checked to exist before any captioning, and a pair named
twice is refused (its caption would be written twice).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from procap.core import validate
from procap.core.errors import ProCapError
from procap.core.json_files import json_lines, read_bytes

LIST_FORMATS = (".csv", ".jsonl")
SIDES = ("before", "after")
_SHOWN_NAMES = 5  # names listed in a message before "and N more"


def pair_key(before: str | os.PathLike, after: str | os.PathLike) -> tuple[str, str]:
    """The id of a pair: both paths absolute and normalised, so that a pair reads the same whoever names it."""
    return os.path.normpath(os.path.abspath(before)), os.path.normpath(os.path.abspath(after))


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN_NAMES])
    return shown if len(names) <= _SHOWN_NAMES else f"{shown} and {len(names) - _SHOWN_NAMES} more"


def read_rows(
    data: bytes, suffix: str, source: str, columns: Sequence[str], errors: str = "strict"
) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of each row of a pair file: CSV whose header line names the columns, or JSON Lines of
    one object a line. The one reader of pair rows: the pair lists here and the caption files of
    :mod:`procap.fast.caption_file` (which add a ``caption``).

    Args:
        data: the file's bytes (UTF-8; a spreadsheet's byte-order mark is skipped).
        suffix: ``".csv"`` or ``".jsonl"``.
        source: how messages name the file, e.g. ``"--pairs pairs.csv"``.
        columns: what each row must give as text; other columns or keys are kept.
        errors: how bytes that are not UTF-8 are decoded: refused (``"strict"``), or ``"surrogateescape"`` for a file
            this package wrote with file names as the OS gave them (a caption file).

    Raises:
        ProCapError: text that is not UTF-8, CSV without a header line naming ``columns`` or with a row of more
            fields than it, a JSON Lines line that is not an object (or names a key twice), a row lacking a column.
    """
    try:
        text = data.decode("utf-8-sig", errors)
    except UnicodeDecodeError as exc:
        raise ProCapError(f"{source} is not UTF-8 text ({exc}).") from None
    if not text.strip():
        return []
    rows = _csv_rows(text, source, columns) if suffix == ".csv" else _json_lines_rows(text, source, columns)
    for number, row in rows:
        for column in columns:
            if not isinstance(row.get(column), str):
                raise ProCapError(f"{source} line {number} gives no {column}.")
    return rows


def _csv_rows(text: str, source: str, columns: Sequence[str]) -> list[tuple[int, dict[str, Any]]]:
    """The rows of CSV ``text`` whose header line names ``columns`` (:func:`read_rows`)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = [column for column in columns if column not in (reader.fieldnames or [])]
        if missing:
            raise ProCapError(
                f"{source} has no {' or '.join(missing)} column in its header line (it needs "
                f"{' and '.join(repr(column) for column in columns)} columns)."
            )
        for row in reader:
            if None in row:  # DictReader keeps the fields past the header's under None
                raise ProCapError(f"{source} line {reader.line_num} has more fields than its header line.")
            rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise ProCapError(f"{source} is not a readable CSV file ({exc}).") from None
    return rows


def _json_lines_rows(text: str, source: str, columns: Sequence[str]) -> list[tuple[int, dict[str, Any]]]:
    """The rows of JSON Lines ``text``, one object a line (:func:`read_rows`)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, row in json_lines(text, source):  # a key given twice is refused too
        if not isinstance(row, dict):
            raise ProCapError(f"{source} line {number} is not a JSON object with {' and '.join(columns)} keys.")
        rows.append((number, row))
    return rows


def read_pair_list(path: str | os.PathLike, flag: str = "--pairs") -> list[tuple[Path, Path]]:
    """The ``(before, after)`` image paths a CSV or JSON Lines list names, relative ones against its folder.

    Raises:
        ProCapError: one sentence naming the list (and its line) for another format, a missing column or key, a
            value that is no path, an image that does not exist, a pair listed twice or an empty list.
    """
    path = validate.input_file(path, f"{flag} file")
    suffix = path.suffix.lower()
    if suffix not in LIST_FORMATS:
        raise ProCapError(f"{flag} {path} must be a .csv or .jsonl file, not {suffix or 'a file without suffix'}.")
    # refused from its size when larger than a pair list can be
    rows = read_rows(read_bytes(path, flag), suffix, f"{flag} {path}", SIDES)
    pairs: list[tuple[Path, Path]] = []
    lines_of: dict[tuple[str, str], int] = {}  # the line that first listed each pair
    for number, row in rows:
        images = []
        for side in SIDES:
            value = row[side]
            if not value.strip():
                raise ProCapError(f"{flag} {path} line {number} gives no {side} image path.")
            image = path.parent / value.strip()  # an absolute value stays absolute
            images.append(validate.input_file(image, f"{flag} {path} line {number}: {side} image"))
        key = pair_key(*images)
        if key in lines_of:
            raise ProCapError(f"{flag} {path} lists the pair on line {number} again (first on line {lines_of[key]}).")
        lines_of[key] = number
        pairs.append((images[0], images[1]))
    if not pairs:
        raise ProCapError(f"{flag} {path} lists no image pairs.")
    return pairs


def _image_names(folder: Path) -> set[str]:
    """Names of the image files of ``folder`` (the suffixes Pillow reads; hidden files skipped)."""
    suffixes = set(Image.registered_extensions())
    return {
        entry.name
        for entry in folder.iterdir()
        if not entry.name.startswith(".") and entry.suffix.lower() in suffixes and entry.is_file()
    }


def match_folders(
    before_dir: str | os.PathLike,
    after_dir: str | os.PathLike,
    flags: tuple[str, str] = ("--before-dir", "--after-dir"),
) -> list[tuple[Path, Path]]:
    """The ``(before, after)`` images of two folders paired by file name, in name order.

    Raises:
        ProCapError: a folder is missing or holds no images, or a name is in one folder only (the sentence lists
            them).
    """
    before_dir, after_dir = validate.input_dir(before_dir, flags[0]), validate.input_dir(after_dir, flags[1])
    before_names, after_names = _image_names(before_dir), _image_names(after_dir)
    only_before, only_after = sorted(before_names - after_names), sorted(after_names - before_names)
    if only_before or only_after:
        parts = [
            f"{len(names)} image(s) only in {flag} {folder} ({_names(names)})"
            for names, flag, folder in ((only_before, flags[0], before_dir), (only_after, flags[1], after_dir))
            if names
        ]
        raise ProCapError(f"images are paired by file name, but there are {' and '.join(parts)}.")
    if not before_names:
        raise ProCapError(f"{flags[0]} {before_dir} and {flags[1]} {after_dir} hold no images.")
    return [(before_dir / name, after_dir / name) for name in sorted(before_names)]
