"""Atomic file writes: the one helper every writer of results, vocabularies, caches and checkpoints goes through.

A file is written to a temporary name in its own folder and moved into place with ``os.replace`` only when the
write succeeded, so a reader never sees half a file and an interrupted run leaves the old file (or none) behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_current_umask()


def atomic_write(path: str | os.PathLike, writer: Callable[[str], object]) -> Path:
    """Call ``writer(tmp_path)`` and move the result onto ``path`` only when it returned without raising.

    Args:
        path: the final file; its parent folders are created.
        writer: writes the complete file at the temporary path it is given.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    os.close(fd)
    try:
        writer(tmp)
        # mkstemp creates 0600; give the file the mode a plain open() would (or keep the replaced file's mode).
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (serialised before the file is opened)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent))
