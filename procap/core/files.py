"""Atomic file writes: the one helper every writer of results, vocabularies, caches and checkpoints goes through.

A file is written to a temporary name in its own folder and moved into place with ``os.replace`` only when the
write succeeded, so a reader never sees half a file and an interrupted run leaves the old file (or none) behind;
folders created for it are removed again when the write fails.

Two rules hold for every write made here:

- an operating-system failure (disk full, quota, file too large, permissions changed while running) is raised as
  :class:`OutputError` naming the output, never the temporary file, whatever library did the writing
  (:func:`writing` also serves writers that cannot be atomic, such as HDF5 caches);
- a command never writes over one of its own inputs: the CLI registers them with :func:`protect_inputs`, and a
  write onto such a file (same path, symlink or hard link) or into such a folder is refused.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procap.core.errors import ProCapError

if TYPE_CHECKING:
    from typing_extensions import Self

if sys.platform == "win32":  # no flock: outputs there are not guarded
    fcntl = None
else:
    import fcntl


class OutputError(OSError):
    """Writing an output failed at the operating-system level; ``filename`` is the output the user named.

    ``note`` (empty by default) says what the failed command left behind, e.g. a run folder without a checkpoint.
    """

    note: str = ""


# The operating system's refusals of a write, each said in the one sentence of an output that cannot be written
# (``cannot write <output> (<reason>).``), whichever call met it: disk full, quota, file-size limit, read-only.
WRITE_FAILURES = frozenset(
    number for number in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG, errno.EROFS) if number
)

# Libraries that wrap OS errors in their own exception types keep the errno only in the text:
# Rust's std::io (safetensors) writes "(os error 28)", HDF5 (h5py) writes "errno = 28".
_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\berrno = (\d+)")


def os_error_in(exc: BaseException) -> tuple[int, str] | None:
    """``(errno, message)`` when ``exc`` reports an operating-system failure, else ``None``.

    Recognises :class:`OSError` with an errno and the safetensors / h5py exceptions that carry one in their text.
    """
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno, exc.strerror or os.strerror(exc.errno)
    if not isinstance(exc, Exception):
        return None
    match = _ERRNO_IN_TEXT.search(str(exc))
    if match is None:
        return None
    number = int(match.group(1) or match.group(2))
    return number, os.strerror(number)


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Inside, an operating-system failure of any library becomes an :class:`OutputError` naming ``path``."""
    try:
        yield
    except OutputError:
        raise
    except Exception as exc:
        failure = os_error_in(exc)
        if failure is None:
            raise
        raise OutputError(failure[0], failure[1], str(path)) from exc


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's content, read in 1 MiB blocks (a 1 GB VQGAN takes about a second)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def require_space(path: str | os.PathLike, nbytes: int, file_bytes: int | None = None) -> None:
    """Raise an :class:`OutputError` naming ``path`` when a write of it cannot succeed: its file system has less
    than ``nbytes`` free (ENOSPC), or the file would outgrow this process's file-size limit (EFBIG,
    ``RLIMIT_FSIZE``, which free space does not show).

    For writers that would rather stop before a write than meet its failure part-way; a quota shows only when it
    is met, so what such a write leaves must be whole anyway (procedure caches: :mod:`procap.procedure.cache`).

    Args:
        path: the file to be written (need not exist).
        nbytes: the free space the write needs, margins included.
        file_bytes: the size the file will have (default: no file-size check).
    """
    path = Path(path)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if shutil.disk_usage(folder).free < nbytes:
        raise OutputError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    limit = file_size_limit()
    if file_bytes is not None and limit is not None and file_bytes > limit:
        raise OutputError(errno.EFBIG, os.strerror(errno.EFBIG), str(path))


def file_size_limit() -> int | None:
    """The largest file this process may write, in bytes (``RLIMIT_FSIZE``), or ``None`` when unlimited."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


# ------------------------------------------------------------------------------------- inputs never overwritten
_protected: list[tuple[str, Path]] = []  # (how messages name it, the input) while a command runs


@contextmanager
def protect_inputs(inputs: Iterable[tuple[str, str | os.PathLike]]) -> Iterator[None]:
    """While inside, :func:`refuse_inputs` (and so every write through this module) protects ``inputs``.

    Args:
        inputs: ``(name, path)`` of every file or folder the running command reads, e.g. ``("--refs", "r.json")``.
    """
    added = [(name, Path(path)) for name, path in inputs]
    _protected.extend(added)
    try:
        yield
    finally:
        for entry in added:
            _protected.remove(entry)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def input_overlap(output: str | os.PathLike, inputs: Iterable[tuple[str, str | os.PathLike]]) -> str | None:
    """Why writing ``output`` would touch one of ``inputs`` (one clause naming that input), or ``None``.

    ``output`` touches an input when it is that file (the same path, or the same file through a symlink or a hard
    link) or lies inside that folder (after resolving symlinks).
    """
    target = Path(os.path.realpath(output))
    for name, raw in inputs:
        source = Path(raw)
        real = Path(os.path.realpath(source))
        if source.is_dir():
            if target == real or real in target.parents:
                return f"lies inside {name} {source}, a folder this command reads"
        elif target == real or _same_file(Path(output), source):
            return f"is {name} {source}, which this command reads"
    return None


def refuse_inputs(*outputs: str | os.PathLike) -> None:
    """Raise :class:`ProCapError` when one of ``outputs`` would overwrite an input under :func:`protect_inputs`.

    Writers that know their file names early (a training run's checkpoints) call this before any work.
    """
    for output in outputs:
        overlap = input_overlap(output, _protected)
        if overlap is not None:
            raise ProCapError(f"the output {output} {overlap}; write it elsewhere.")


# ------------------------------------------------------------------------------------------------- writing
def _current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_current_umask()


def make_parents(path: Path) -> list[Path]:
    """Create the missing folders above ``path``; returns them, deepest first, for :func:`remove_empty`."""
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return missing


def remove_empty(folders: Iterable[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is still empty: what a failed write created, nothing else."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


_TEMP_SUFFIX = ".tmp"
_TEMP_RANDOM = 8  # the characters tempfile.mkstemp puts between prefix and suffix


def name_limit(folder: str | os.PathLike) -> int:
    """The longest file name, in bytes, that ``folder``'s file system takes (255 where it does not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def temp_prefix(name: str, folder: str | os.PathLike) -> str:
    """``.<name>.``, with ``name`` shortened (at a character boundary) so that the temporary file's whole name
    stays within ``folder``'s name limit: a legal 242-255-byte output name otherwise failed after the work was
    done, at the creation of its temporary file."""
    room = name_limit(folder) - len(b"..") - _TEMP_RANDOM - len(_TEMP_SUFFIX)
    encoded = os.fsencode(name)
    if len(encoded) > room:
        name = encoded[: max(room, 0)].decode("utf-8", "ignore")
    return f".{name}."


def atomic_write(path: str | os.PathLike, writer: Callable[[str], object]) -> Path:
    """Call ``writer(tmp_path)`` and move the result onto ``path`` only when it returned without raising.

    Args:
        path: the final file; its parent folders are created (and removed again if the write fails).
        writer: writes the complete file at the temporary path it is given.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OutputError: the operating system refused the write (naming ``path``).
        ProCapError: ``path`` is an input of the running command (:func:`protect_inputs`).
    """
    path = Path(path)
    refuse_inputs(path)
    if is_stream(path):
        return _write_through(path, writer)
    created: list[Path] = []
    tmp = None
    try:
        with writing(path):
            created = make_parents(path)
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name, path.parent), suffix=_TEMP_SUFFIX, dir=path.parent)
            os.close(fd)
            writer(tmp)
            # mkstemp creates 0600; give the file the mode a plain open() would (or keep the replaced file's mode).
            os.chmod(tmp, _mode_for(path))
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        remove_empty(created)
        raise
    return path


def remove_dead_temps(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that :func:`atomic_write` of ``path`` leaves when its process is killed mid-write
    (``kill -9`` skips the cleanup); returns them.

    Only for the one writer of ``path`` (a training run holding its folder's lock): a live writer's temporary file
    has the same form.
    """
    path = Path(path)
    pattern = glob.escape(temp_prefix(path.name, path.parent)) + "?" * _TEMP_RANDOM + glob.escape(_TEMP_SUFFIX)
    removed = []
    for dead in path.parent.glob(pattern):
        dead.unlink(missing_ok=True)
        removed.append(dead)
    return removed


def is_stream(path: str | os.PathLike) -> bool:
    """True when ``path`` is (or links to) a character device or a named pipe: ``/dev/stdout``, ``/dev/null``, a FIFO.

    Such an output is written through; a rename onto it would replace the device or pipe with a regular file (as
    root, ``--out /dev/null`` would have turned ``/dev/null`` into a file).
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _write_through(path: Path, writer: Callable[[str], object]) -> Path:
    """:func:`atomic_write` onto a stream: ``writer`` fills a temporary file, which is then copied into ``path``."""
    import shutil

    folder = tempfile.gettempdir()
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name, folder), suffix=_TEMP_SUFFIX, dir=folder)
    os.close(fd)
    try:
        with writing(path):
            writer(tmp)
            with open(tmp, "rb") as source, open(path, "wb") as target:
                shutil.copyfileobj(source, target)
    finally:
        os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (serialised before the file is opened)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent))


# ----------------------------------------------------------------------------------------------- replacing folders
def beside(final: str | os.PathLike, tag: str) -> Path:
    """``.<name>.<tag>`` in ``final``'s folder: where a swap keeps the old folder (``replaced``) or writes the new
    (``replacing-``). ``name`` is shortened to fit the name limit, with a hash of the whole name, so two folders
    never share a name beside them."""
    final = Path(final)
    name, folder = final.name, final.parent
    if len(os.fsencode(f".{name}.{tag}")) + 16 > name_limit(folder):
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
        name = f"{os.fsencode(name)[:64].decode('utf-8', 'ignore')}-{digest}"
    return folder / f".{name}.{tag}"


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block are delivered when it ends (main thread only; elsewhere
    Python delivers no signals anyway), so a Ctrl-C cannot land between two renames that belong together."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda s, _frame: received.append(s)) for signum in _DEFERRED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for pending in dict.fromkeys(received):
            signal.raise_signal(pending)


_DEFERRED = (signal.SIGINT, signal.SIGTERM)


def swap_folder(new: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the complete folder ``new`` in the place of the folder ``final`` (both in one parent folder).

    Two renames (``final`` to :func:`beside` ``final`` ``"replaced"``, then ``new`` to ``final``) with Ctrl-C and
    SIGTERM deferred between them, then the old folder is deleted. An error between the renames puts the old
    folder back. The one window the renames cannot close is a process killed outright (``kill -9``, power loss)
    between them: ``final`` is then missing and the old folder lies beside it, and :func:`recover_swap`, which
    every writer of such a folder calls first, puts it back.
    """
    new, final = Path(new), Path(final)
    recover_swap(final)
    backup = beside(final, "replaced")
    with signals_deferred():
        os.rename(final, backup)
        try:
            os.rename(new, final)
        except BaseException:
            os.rename(backup, final)
            raise
    shutil.rmtree(backup, ignore_errors=True)


def recover_swap(final: str | os.PathLike) -> str | None:
    """Finish what a :func:`swap_folder` stopped between its steps left beside ``final``.

    The old folder beside a missing ``final`` (killed between the renames) is put back: the replacement did not
    finish, so the old folder is the complete one. Beside an existing ``final`` it is what the finished swap had
    not deleted yet, and is deleted now.

    Returns:
        A sentence saying what was done, or ``None`` when nothing was left.
    """
    final = Path(final)
    backup = beside(final, "replaced")
    if not backup.is_dir():
        return None
    if final.exists() or final.is_symlink():
        shutil.rmtree(backup, ignore_errors=True)
        return f"removed {backup}, the old copy of {final} left by a replacement that had finished"
    os.rename(backup, final)
    return f"put back {final} from {backup}, where a replacement stopped between its two renames had left it"


# ------------------------------------------------------------------------------------------- files as one unit
UNIT_STAGING = "saving"  # beside(anchor, UNIT_STAGING): a unit being written; incomplete until renamed to committed
UNIT_COMMITTED = "saved"  # beside(anchor, UNIT_COMMITTED): a complete unit whose files are being moved into place


def _move_unit_into_place(committed: Path, folder: Path, names: Sequence[str]) -> None:
    """Move the files of the committed unit ``committed`` into ``folder``, in the order of ``names``; what is
    already there was moved by a process killed part-way, which is why this may run again."""
    for name in names:
        staged = committed / name
        if staged.is_file():
            os.replace(staged, folder / name)
    shutil.rmtree(committed)


def recover_unit(anchor: str | os.PathLike, names: Sequence[str]) -> list[str]:
    """Finish what a :func:`commit_unit` killed part-way left beside ``anchor``: a committed unit is moved into
    place, an uncommitted one deleted (the files in place are then the previous unit, whole).

    Only for the one writer of those files (a process holding their lock): a live commit looks the same.

    Returns:
        A clause per thing done (``moved into place ...``, ``deleted ...``); empty when nothing was left.
    """
    anchor = Path(anchor)
    committed, staging = beside(anchor, UNIT_COMMITTED), beside(anchor, UNIT_STAGING)
    done = []
    if committed.is_dir():
        with writing(anchor):
            _move_unit_into_place(committed, anchor.parent, names)
        done.append(f"moved into place the save of {anchor} that a killed run had completed")
    if staging.exists():
        shutil.rmtree(staging)
        done.append(f"deleted an unfinished save of {anchor} left by a killed run")
    return done


def commit_unit(anchor: str | os.PathLike, names: Sequence[str], write: Callable[[Path], None]) -> None:
    """Write the files ``names`` of ``anchor``'s folder as one unit: all of them or none are replaced.

    ``write(staging)`` writes them into a staging folder beside ``anchor`` (:func:`beside` ``anchor``
    ``"saving"``), which one rename commits (to ``... "saved"``); its files are then moved into place. A process
    killed at any moment leaves either the previous files whole (and a staging folder) or a committed unit, and
    the next writer's :func:`recover_unit` deletes the one or finishes moving the other. One rename per file could
    not do this: a kill between two of them left new files beside old ones (new weights under an old model card).

    Args:
        anchor: the unit's main file; the staging folders are named after it and ``anchor``'s folder is created
            when missing (and removed again if the write fails).
        names: the unit's file names in that folder, in the order they are moved into place (the one that names
            the others last).
        write: writes the files into the folder it is given; a name it does not write is left as it was.

    Raises:
        OutputError: the operating system refused a write, naming the file in place, never the staging folder.
    """
    anchor = Path(anchor)
    refuse_inputs(*(anchor.parent / name for name in names))  # the moves into place are writes too
    created: list[Path] = []
    with writing(anchor):
        created = make_parents(anchor)
    recover_unit(anchor, names)
    staging = beside(anchor, UNIT_STAGING)
    try:
        with writing(anchor):
            staging.mkdir()
        write(staging)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty(created)
        if isinstance(exc, OutputError) and exc.filename:
            # the staged file's name is the final file's: the one the user knows
            raise OutputError(exc.errno, exc.strerror, str(anchor.with_name(Path(exc.filename).name))) from exc
        raise
    commit_staged(anchor, names)


def commit_staged(anchor: str | os.PathLike, names: Sequence[str]) -> None:
    """Commit the complete unit written into :func:`beside` ``anchor`` ``"saving"`` and move its files into place
    (the last step of :func:`commit_unit`, for writers that fill the staging folder over a long run)."""
    anchor = Path(anchor)
    committed = beside(anchor, UNIT_COMMITTED)
    with writing(anchor), signals_deferred():  # a Ctrl-C lands before the commit or after the moves
        os.rename(beside(anchor, UNIT_STAGING), committed)  # the commit: from here on the new unit is the one in place
        _move_unit_into_place(committed, anchor.parent, names)


# ----------------------------------------------------------------------------------------- one writer per output
def try_exclusive_flock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting; False when another process holds one.

    True also where there is no flock (Windows, some network mounts): the write then runs unguarded rather than
    not at all.
    """
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


class RunFolderLock:
    """Exclusive, non-blocking lock on a folder (``flock`` on the folder's own descriptor).

    The holder also writes who it is (:func:`holder_record`) into ``.<name>.lock`` beside the folder, so that a
    refused writer can name it; the file is deleted on exit and only informs (the lock is the ``flock``), so a
    parent folder that takes no new file leaves the refusal without a name rather than the run without a lock.

    Args:
        folder: an existing folder.
        flag: how messages name it (``--out``).

    Raises:
        ProCapError: another process holds the lock (the sentence names its process id, command and host when
            it recorded them).
    """

    def __init__(self, folder: str | os.PathLike, flag: str = "--out") -> None:
        self.folder, self.flag = Path(folder), flag
        self.record = beside(self.folder, "lock")
        self._fd: int | None = None

    def __enter__(self) -> Self:
        fd = os.open(self.folder, os.O_RDONLY)
        if not try_exclusive_flock(fd):
            os.close(fd)
            try:
                with open(self.record, "rb") as handle:
                    holder = handle.read(_HOLDER_BYTES).decode("utf-8", "replace").strip()
            except OSError:
                holder = ""
            named = f" ({holder})" if holder else ""
            raise ProCapError(
                f"{self.flag} {self.folder} is in use by another procap run{named}; wait for it to finish "
                "or choose another folder."
            )
        self._fd = fd
        try:
            with open(self.record, "wb") as handle:
                handle.write(holder_record().encode("utf-8", "backslashreplace"))
        except OSError:
            pass  # the refusal of a second writer then names no holder; the lock itself holds
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.record.unlink(missing_ok=True)  # while still held: a waiting writer never reads a dead record
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


_HOLDER_CHARS = 300  # how much of a holder's command line a refusal quotes
_HOLDER_BYTES = 4 * _HOLDER_CHARS  # what a refused writer reads of a holder's record (UTF-8, host included)


def holder_record() -> str:
    """``pid N: COMMAND, host NAME``: who holds an output lock, as a refused writer names it (the command line
    cut to :data:`_HOLDER_CHARS` characters; a name the OS gave in bytes that are no UTF-8 shown escaped)."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    return f"pid {os.getpid()}: {command[:_HOLDER_CHARS]}, host {socket.gethostname()}"


class OutputLock:
    """One writer per output file: an exclusive ``flock`` on ``.<name>.lock`` beside it, held while inside.

    A lock file rather than the output itself, because a replaced output is a new file (a lock on the old one
    would not stop a writer of the new). The holder writes its process id and command line into the lock file,
    so that a refused writer can name it, and deletes the file on exit; a killed holder's file is taken over (the
    kernel dropped its flock). Folders created for the lock file are removed again on exit when still empty.

    Args:
        output: the file to guard.
        flag: how messages name it (``--out``).

    Raises:
        ProCapError: another process holds the lock (the sentence names it).
        OutputError: the lock file cannot be created.
    """

    def __init__(self, output: str | os.PathLike, flag: str = "--out") -> None:
        self.output, self.flag = Path(output), flag
        self.lock_file = beside(self.output, "lock")
        self._fd: int | None = None
        self._created: list[Path] = []

    def __enter__(self) -> Self:
        with writing(self.output):
            self._created = make_parents(self.lock_file)
        while self._fd is None:
            with writing(self.output):
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            if not try_exclusive_flock(fd):
                holder = os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").strip() or "another procap run"
                os.close(fd)
                raise ProCapError(
                    f"{self.flag} {self.output} is being written by {holder}; wait for it to finish or choose "
                    "another file."
                )
            # the holder before may have deleted the file between this open and the flock: lock the one in place
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(self.lock_file))
            except FileNotFoundError:
                current = False
            if current:
                self._fd = fd
            else:
                os.close(fd)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"procap ({holder_record()})".encode("utf-8", "backslashreplace"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        self.lock_file.unlink(missing_ok=True)  # while still held, so that a writer waiting to lock sees it gone
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None
        remove_empty(self._created)
