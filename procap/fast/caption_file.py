"""Captions of many pairs streamed to a JSON Lines or CSV file, batch by batch, resumable.

Each batch is appended as whole lines in one write and flushed to disk before the next batch is captioned, so an
interrupted run loses at most the batch in flight. Should a write itself be cut (power loss, a full disk), the
incomplete last line is dropped when the file is resumed. A row is ``before, after, caption``; the two image
paths, absolute, are the pair's id: resuming skips every pair already in the file.

Three rules keep the file one run's work:

- **One writer.** The file is locked for the run (:class:`procap.core.files.OutputLock`, ``.<name>.lock`` beside it):
  two runs on one file wrote up to 192 of 200 pairs twice, both with exit 0.
- **Replaced whole.** ``overwrite`` writes the new file in a staging folder beside the old one and moves it into
  place when complete (:func:`procap.core.files.commit_staged`): it truncated the old file at its first batch, and a
  run killed then left 4 of 200 rows. What a killed replacement leaves is deleted by the next run on the file.
- **One checkpoint and one decoding.** The checkpoint (its size and SHA-256) and the decoding settings the rows
  were captioned with are kept in ``.<name>.settings.json`` beside the file (neither JSON Lines nor CSV has room
  for them without changing what a row is), and :meth:`CaptionFile.check_settings` refuses to resume with others:
  a resume with another checkpoint or ``--max-len`` mixed two models' captions in one file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from tqdm import tqdm

from procap.core import validate
from procap.core.errors import ProCapError
from procap.core.files import (
    UNIT_STAGING,
    OutputError,
    OutputLock,
    atomic_write_json,
    beside,
    commit_staged,
    is_stream,
    make_parents,
    recover_unit,
    refuse_inputs,
    remove_empty,
    writing,
)
from procap.core.json_files import read_bytes, read_json
from procap.data.pair_lists import pair_key, read_rows

if TYPE_CHECKING:
    from typing_extensions import Self

OUTPUT_FORMATS = (".jsonl", ".csv")
COLUMNS = ("before", "after", "caption")
# Rows are UTF-8, and an image path the OS gave in bytes that are no UTF-8 (Python holds them as surrogate escapes,
# os.fsdecode) is written as those bytes, so the file names the image the OS names; encoding such a path as UTF-8
# failed after the work was done. A resume reads the bytes back to the same path.
ROW_ENCODING, NAME_BYTES = "utf-8", "surrogateescape"


class CaptionFile:
    """An output of captions: what it already holds (:attr:`done`) and :meth:`append` for new rows.

    Nothing is written until the first :meth:`append`, so a command that stops on a bad argument after opening
    it leaves an existing file as it was. The file is locked from here to :meth:`close` (use it as a context
    manager); :meth:`finish` after the last append puts a replacement in place.

    Args:
        path: a ``.jsonl`` or ``.csv`` file.
        resume: keep the rows of an existing file and skip their pairs.
        overwrite: replace an existing file (with the new one, once :meth:`finish` is reached).
        flag: how messages name the output.

    Raises:
        ProCapError: another suffix, both ``resume`` and ``overwrite``, an existing file without either, an
            existing file to resume that is not an output of this kind, or another process writing the file.
    """

    def __init__(self, path: str | os.PathLike, resume: bool = False, overwrite: bool = False, flag: str = "--out"):
        self.path, self.flag = validate.output_file(path, flag), flag
        self.format = self.path.suffix.lower()
        if self.format not in OUTPUT_FORMATS:
            raise ProCapError(f"{flag} {self.path} must end in .jsonl or .csv (the format of the captions).")
        if resume and overwrite:
            raise ProCapError("--resume keeps the captions already written and --overwrite drops them; give one.")
        refuse_inputs(self.path)
        self.settings_path = beside(self.path, "settings.json")
        self.done: set[tuple[str, str]] = set()
        self.note: str | None = None  # what a killed run had left and was cleaned up, for the command to say
        self._keep_bytes: int | None = None  # bytes of whole lines to keep from a resumed file
        self._started = False  # whether this object has written yet
        self._stream = is_stream(self.path)  # a named pipe or a device: written through, nothing to resume
        self._handle: BinaryIO | None = None  # a stream's, open from the first append to close()
        self._replacing = False  # rows go to the staging folder, moved into place by finish()
        self._settings: dict[str, Any] | None = None  # what check_settings was given, written with the rows
        self._recorded: dict[str, Any] | None = None  # what the resumed file records
        self._lock = None if self._stream else OutputLock(self.path, flag)
        if self._lock is None:
            return
        self._lock.__enter__()
        try:
            self._open_existing(resume, overwrite)
        except BaseException:
            self.close()
            raise

    def _open_existing(self, resume: bool, overwrite: bool) -> None:
        # this process is the file's one writer now, so what a replacement left beside it belongs to a dead run
        cleaned = recover_unit(self.path, self._unit_names())
        self.note = " and ".join(cleaned) or None
        if not self.path.exists():
            return
        if not (resume or overwrite):
            raise ProCapError(
                f"{self.flag} {self.path} exists; add --resume to caption only the pairs it lacks, "
                "or --overwrite to replace it."
            )
        if overwrite:
            self._replacing = True
            return
        self._read_existing()
        if self.settings_path.is_file():
            recorded = read_json(self.settings_path, "caption settings file")
            self._recorded = recorded if isinstance(recorded, dict) else {}

    def _unit_names(self) -> list[str]:
        """The file and its settings, in the order a replacement moves them into place."""
        return [self.settings_path.name, self.path.name]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_settings(self, checkpoint: Mapping[str, Any], decoding: Mapping[str, Any]) -> None:
        """Record what the rows are captioned with; refuse a resume of a file captioned with something else.

        Args:
            checkpoint: ``{"file", "bytes", "sha256"}`` of the weights; the hash decides, so the same weights
                under another path pass.
            decoding: the settings that change a caption, keyed by their flags (``{"--max-len": 20, "--strategy":
                "sample", "--seed": 1, ...}``), compared in this order: the first that differs is named.

        Raises:
            ProCapError: the resumed file records another checkpoint or another value of a decoding setting.
        """
        settings = {"checkpoint": dict(checkpoint), "decoding": dict(decoding)}
        recorded = self._recorded
        if recorded is not None:
            before = _section(recorded, "checkpoint")
            if (before.get("sha256"), before.get("bytes")) != (checkpoint["sha256"], checkpoint["bytes"]):
                raise ProCapError(
                    f"--resume: {self.path} was captioned with the checkpoint {before.get('file')} "
                    f"(sha256 {str(before.get('sha256'))[:12]}), not {checkpoint['file']} "
                    f"(sha256 {checkpoint['sha256'][:12]}); resume with that checkpoint, or give --overwrite "
                    "or another --out."
                )
            decoded = _section(recorded, "decoding")
            # in the order given (the strategy before its options), then what only the file records
            for flag in [*decoding, *(flag for flag in decoded if flag not in decoding)]:
                if decoded.get(flag) != decoding.get(flag):
                    was, now = (_setting(values.get(flag)) for values in (decoded, decoding))
                    raise ProCapError(
                        f"--resume: {self.path} was captioned with {flag} {was}, not {now}; resume with {flag} "
                        f"{was}, or give --overwrite or another --out."
                    )
        elif self._keep_bytes:  # rows to resume, and nothing saying what made them
            unchecked = (
                f"{self.path} records no checkpoint or decoding settings (written by an older procap, or moved "
                f"without its {self.settings_path.name}), so its rows are resumed unchecked"
            )
            self.note = f"{self.note} and {unchecked}" if self.note else unchecked
        self._settings = settings

    def _read_existing(self) -> None:
        data = read_bytes(self.path, self.flag)  # refused from its size when larger than a captions file can be
        self._keep_bytes = data.rfind(b"\n") + 1  # a line without its newline is the cut end of a write
        try:
            rows = read_rows(data[: self._keep_bytes], self.format, f"{self.flag} {self.path}", COLUMNS, NAME_BYTES)
        except ProCapError as exc:
            raise ProCapError(f"{str(exc).rstrip('.')}, so it is not a caption file to resume.") from None
        self.done = {pair_key(row["before"], row["after"]) for _, row in rows}

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
        keyed = [(*pair_key(before, after), caption) for before, after, caption in rows]
        with writing(self.path):
            if self._stream:
                self._append_to_stream(keyed)
            else:
                self._append_to_file(keyed)
        self._keep_bytes, self._started = None, True
        self.done.update((before, after) for before, after, _ in keyed)

    def _target(self) -> Path:
        """Where the rows go: the file, or while replacing it, its copy in the staging folder beside it."""
        return beside(self.path, UNIT_STAGING) / self.path.name if self._replacing else self.path

    def _write_settings(self, folder: Path) -> None:
        """Put :meth:`check_settings`' record into ``folder`` before the rows it describes, where it is not there."""
        if self._settings is not None and self._settings != self._recorded:
            try:
                atomic_write_json(folder / self.settings_path.name, self._settings, indent=1)
            except OutputError as exc:  # named as the output the user gave: the settings are part of it
                raise OutputError(exc.errno, exc.strerror, str(self.path)) from exc
            self._recorded = self._settings

    def _append_to_file(self, rows: list[tuple[str, str, str]]) -> None:
        target = self._target()
        created: list[Path] = []  # folders made for a new file, removed again if its first write fails
        if self._keep_bytes is None and not self._started:  # a new file, or the replacement of one
            if self._replacing:
                target.parent.mkdir()
            created = make_parents(target)
            mode, header = "wb", True
        else:
            mode, header = "r+b", self._keep_bytes == 0
        self._write_settings(target.parent)
        data = self._lines(rows, header=header and self.format == ".csv").encode(ROW_ENCODING, NAME_BYTES)
        # unbuffered: what a failed write leaves is on disk now, where the truncate below reaches it, and closing
        # has nothing left to flush
        with open(target, mode, buffering=0) as handle:
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
                    target.unlink(missing_ok=True)
                    (target.parent / self.settings_path.name).unlink(missing_ok=True)
                    remove_empty(created)
                raise

    def _append_to_stream(self, rows: list[tuple[str, str, str]]) -> None:
        # one handle for the whole run: closing a pipe after a batch would tell its reader the output ended
        if self._handle is None:
            self._handle = open(self.path, "ab")  # noqa: SIM115 (held across appends, closed by close())
        rows_text = self._lines(rows, header=not self._started and self.format == ".csv")
        self._handle.write(rows_text.encode(ROW_ENCODING, NAME_BYTES))
        self._handle.flush()

    def finish(self) -> None:
        """After the last append: a replacement takes the old file's place (with its settings, as one unit)."""
        if self._replacing and self._started:
            commit_staged(self.path, self._unit_names())
            self._replacing = False

    def close(self) -> None:
        """Release the file: close a stream's handle, delete an unfinished replacement (the old file stays as it
        was) and unlock. A file itself is closed after each batch."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._replacing:
            shutil.rmtree(beside(self.path, UNIT_STAGING), ignore_errors=True)
            self._replacing = False
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None


def _section(recorded: Mapping[str, Any], key: str) -> dict[str, Any]:
    """One section of a settings file; one of another type (a hand-edited file) reads as empty, so it differs."""
    value = recorded.get(key)
    return value if isinstance(value, dict) else {}


def _setting(value: Any) -> str:
    """A recorded decoding setting as a message quotes it."""
    return "no value recorded" if value is None else json.dumps(value)


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
