"""Captions of many pairs streamed to a JSON Lines or CSV file, batch by batch, resumable.

Each batch is appended as whole lines in one write and flushed to disk before the next batch is captioned, so an
interrupted run loses at most the batch in flight. Should a write itself be cut (power loss, a full disk), the
incomplete last line is dropped when the file is resumed. A row is ``before, after, caption``; the two image
paths, absolute, are the pair's id: resuming skips every pair already in the file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from procap import validate
from procap.data.pair_lists import pair_key
from procap.errors import ProCapError
from procap.files import is_stream, make_parents, refuse_inputs, remove_empty, writing
from procap.json_files import parse_json, read_bytes

OUTPUT_FORMATS = (".jsonl", ".csv")
COLUMNS = ("before", "after", "caption")


class CaptionFile:
    """An output of captions: what it already holds (:attr:`done`) and :meth:`append` for new rows.

    Nothing is written until the first :meth:`append`, so a command that stops on a bad argument after opening
    it leaves an existing file as it was.

    Args:
        path: a ``.jsonl`` or ``.csv`` file.
        resume: keep the rows of an existing file and skip their pairs.
        overwrite: replace an existing file (its rows are dropped at the first append).
        flag: how messages name the output.

    Raises:
        ProCapError: another suffix, both ``resume`` and ``overwrite``, an existing file without either, or an
            existing file to resume that is not an output of this kind.
    """

    def __init__(self, path: str | os.PathLike, resume: bool = False, overwrite: bool = False, flag: str = "--out"):
        self.path, self.flag = validate.output_file(path, flag), flag
        self.format = self.path.suffix.lower()
        if self.format not in OUTPUT_FORMATS:
            raise ProCapError(f"{flag} {self.path} must end in .jsonl or .csv (the format of the captions).")
        if resume and overwrite:
            raise ProCapError("--resume keeps the captions already written and --overwrite drops them; give one.")
        refuse_inputs(self.path)
        self.done: set[tuple[str, str]] = set()
        self._keep_bytes: int | None = None  # bytes of whole lines to keep from a resumed file
        self._started = False  # whether this object has written yet
        self._stream = is_stream(self.path)  # a named pipe or a device: written through, nothing to resume
        self._handle: BinaryIO | None = None  # a stream's, open from the first append to close()
        if self.path.exists() and not self._stream:
            if not (resume or overwrite):
                raise ProCapError(
                    f"{flag} {self.path} exists; add --resume to caption only the pairs it lacks, "
                    "or --overwrite to replace it."
                )
            if resume:
                self._read_existing()

    def _read_existing(self) -> None:
        data = read_bytes(self.path, self.flag)  # refused from its size when larger than a captions file can be
        self._keep_bytes = data.rfind(b"\n") + 1  # a line without its newline is the cut end of a write
        try:
            text = data[: self._keep_bytes].decode("utf-8")
        except UnicodeDecodeError:
            raise ProCapError(f"{self.flag} {self.path} is not UTF-8 text, so not captions to resume.") from None
        rows = self._parse(text)
        self.done = {pair_key(row["before"], row["after"]) for row in rows}

    def _parse(self, text: str) -> list[dict]:
        not_ours = f"{self.flag} {self.path} is not a caption file to resume"
        if self.format == ".csv":
            lines = list(csv.reader(io.StringIO(text)))
            if not lines:
                return []
            if tuple(lines[0]) != COLUMNS:
                raise ProCapError(f"{not_ours}: its header is not {','.join(COLUMNS)}.")
            rows = []
            for number, values in enumerate(lines[1:], start=2):
                if len(values) != len(COLUMNS):
                    raise ProCapError(f"{not_ours}: line {number} has {len(values)} fields, not {len(COLUMNS)}.")
                rows.append(dict(zip(COLUMNS, values)))
            return rows
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                row = parse_json(line, f"{not_ours}: line {number}")
            except ProCapError:
                row = None  # said below, as every other line that is not one of ours
            if not (isinstance(row, dict) and all(isinstance(row.get(key), str) for key in COLUMNS)):
                raise ProCapError(f"{not_ours}: line {number} is not a JSON object of {', '.join(COLUMNS)}.")
            rows.append(row)
        return rows

    def _lines(self, rows: Sequence[tuple[str, str, str]], header: bool) -> str:
        if self.format == ".csv":
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            if header:
                writer.writerow(COLUMNS)
            writer.writerows(rows)
            return buffer.getvalue()
        return "".join(json.dumps(dict(zip(COLUMNS, row)), ensure_ascii=False) + "\n" for row in rows)

    def append(self, rows: Sequence[tuple[str | os.PathLike, str | os.PathLike, str]]) -> None:
        """Write ``(before, after, caption)`` rows as whole lines (the paths absolute), in one write, flushed."""
        rows = [(*pair_key(before, after), caption) for before, after, caption in rows]
        with writing(self.path):
            if self._stream:
                self._append_to_stream(rows)
            else:
                self._append_to_file(rows)
        self._keep_bytes, self._started = None, True
        self.done.update((before, after) for before, after, _ in rows)

    def _append_to_file(self, rows: list[tuple[str, str, str]]) -> None:
        created: list[Path] = []  # folders made for a new file, removed again if its first write fails
        if self._keep_bytes is None and not self._started:  # a new file, or one --overwrite replaces
            created = make_parents(self.path)
            mode, header = "wb", True
        else:
            mode, header = "r+b", self._keep_bytes == 0
        data = self._lines(rows, header=header and self.format == ".csv").encode("utf-8")
        # unbuffered: what a failed write leaves is on disk now, where the truncate below reaches it, and closing
        # has nothing left to flush
        with open(self.path, mode, buffering=0) as handle:
            if self._keep_bytes is not None:
                handle.truncate(self._keep_bytes)  # drops the cut line a crashed write may have left
            whole = handle.seek(0, os.SEEK_END)
            try:
                remaining = memoryview(data)
                while remaining:  # a raw write may take only part of the bytes
                    remaining = remaining[handle.write(remaining) :]
                os.fsync(handle.fileno())
            except BaseException:
                # a full disk or a file-size limit stops a write part-way: take the cut line back
                with contextlib.suppress(OSError):
                    handle.truncate(whole)
                if whole == 0 and mode == "wb":  # this write created the file: leave none behind
                    self.path.unlink(missing_ok=True)
                    remove_empty(created)
                raise

    def _append_to_stream(self, rows: list[tuple[str, str, str]]) -> None:
        # one handle for the whole run: closing a pipe after a batch would tell its reader the output ended
        if self._handle is None:
            self._handle = open(self.path, "ab")  # noqa: SIM115 (held across appends, closed by close())
        self._handle.write(self._lines(rows, header=not self._started and self.format == ".csv").encode("utf-8"))
        self._handle.flush()

    def close(self) -> None:
        """Close the handle a stream output keeps open between batches (a file is closed after each batch)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def caption_batches(
    caption: Callable[[list[Path], list[Path]], list[str]],
    pairs: Sequence[tuple[Path, Path]],
    batch_size: int,
    progress: bool = True,
    done: int = 0,
) -> Iterator[list[tuple[Path, Path, str]]]:
    """``(before, after, caption)`` rows of ``pairs``, one list per batch of ``batch_size``, with a progress bar.

    Args:
        caption: captions of a batch, e.g. a :class:`procap.fast.Captioner`.
        pairs: the pairs to caption now.
        batch_size: pairs per call of ``caption``.
        progress: show a tqdm bar on stderr.
        done: pairs of the whole job finished before (the bar starts there).
    """
    validate.number(batch_size, "batch_size", minimum=1)
    with tqdm(
        total=done + len(pairs), initial=done, desc="caption", unit="pair", file=sys.stderr, disable=not progress
    ) as bar:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            captions = caption([before for before, _ in chunk], [after for _, after in chunk])
            yield [(before, after, text) for (before, after), text in zip(chunk, captions)]
            bar.update(len(chunk))
