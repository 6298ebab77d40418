"""Checks of user input made before any work starts: files to read, outputs to write, devices and numbers.

Every check raises :class:`~procap.core.errors.ProCapError` with one sentence that names the file or the argument,
so a command fails in the first second, before it has written anything, instead of with a traceback (or a
half-written output) after a long computation.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from procap.core.config import GENERATED_FRAME_COUNTS
from procap.core.errors import ProCapError, shown
from procap.core.files import input_overlap

if TYPE_CHECKING:  # torch only inside the functions that need it: the parsers are built without it
    import torch

# Seeds reach NumPy, whose generators take 0 .. 2**32 - 1, and torch.Generator.manual_seed (an int64 ... uint64).
MAX_SEED = 2**32 - 1
# Each worker is a process holding its own copy of the data path (and a model, for prepare): far more than any
# machine's cores only multiplies memory until the kernel kills the run.
MAX_WORKERS = 256


def input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path when it is an existing regular file (or a link to one).

    Args:
        path: the file to read.
        what: how the message names it, e.g. ``"checkpoint file"`` or ``"--refs file"``.
    """
    path = Path(path)
    if path.is_dir():
        raise ProCapError(f"{what} {path} is a directory, not a file.")
    if not path.is_file():
        raise ProCapError(f"{what} {path} does not exist.")
    return path


def input_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path when it is an existing directory."""
    path = Path(path)
    if path.is_file():
        raise ProCapError(f"{what} {path} is a file, not a folder.")
    if not path.is_dir():
        raise ProCapError(f"{what} {path} does not exist.")
    return path


def _nearest_existing(path: Path) -> Path:
    """The closest ancestor of ``path`` (or ``path`` itself) that exists; ``.`` for a relative path's root."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, flag: str) -> None:
    """The folders missing above ``path`` can be created: the nearest existing ancestor is a writable folder."""
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        raise ProCapError(f"{flag} {path} cannot be created: {ancestor} is a file, not a folder.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ProCapError(f"{flag} {path} cannot be written: folder {ancestor} is not writable.")


def output_file(path: str | os.PathLike, flag: str) -> Path:
    """Check that a file can be written at ``path`` (it may exist and is then replaced).

    Args:
        path: the file a command will write (through a temporary file and a rename).
        flag: the argument that named it, e.g. ``"--out"``.
    """
    path = Path(path)
    if path.is_dir():
        raise ProCapError(f"{flag} {path} is a directory; give the name of a file to write.")
    _check_creatable(path, flag)
    return path


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """Check that ``path`` is a writable folder or can be created as one (nothing is created here)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ProCapError(f"{flag} {path} is an existing file, not a folder.")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ProCapError(f"{flag} {path} is not a writable folder.")
        return path
    _check_creatable(path, flag)
    return path


def fresh_output_dir(path: str | os.PathLike, names: Sequence[str], flag: str, overwrite: bool, what: str) -> Path:
    """:func:`output_dir`, and that it holds none of the files ``names`` a command writes there unless ``overwrite``:
    an earlier run's output is replaced only when asked, as ``procap caption --out`` refuses an existing file.

    Args:
        names: the files the command writes into the folder.
        what: what they are, for the message (``"an evaluation"``).
    """
    path = output_dir(path, flag)
    found = [name for name in names if (path / name).exists()]
    if found and not overwrite:
        raise ProCapError(
            f"{flag} {path} already holds {what} ({', '.join(found)}); add --overwrite to replace it, or give "
            f"another {flag}."
        )
    return path


def output_apart(path: str | os.PathLike, flag: str, inputs: Sequence[tuple[str, str | os.PathLike]]) -> None:
    """Check that the output ``path`` is none of ``inputs`` (same path, symlink or hard link) and lies in none of
    the input folders: a command never writes over what it reads.

    Args:
        path: the file or folder a command will write.
        flag: the argument that named it, e.g. ``"--out"``.
        inputs: ``(argument, path)`` of everything the command reads.
    """
    overlap = input_overlap(path, inputs)
    if overlap is not None:
        raise ProCapError(f"{flag} {path} {overlap}; choose another {flag}.")


def number(
    value: float | None,
    flag: str,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
) -> None:
    """Range check of a numeric argument; ``None`` (not given) passes.

    Args:
        value: the parsed value.
        flag: its name in messages, e.g. ``"--lr"``.
        minimum, maximum: inclusive bounds.
        above: exclusive lower bound (``above=0`` means "positive").
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # from a config file or the Python API
        raise ProCapError(f"{flag} must be a number, got {shown(value)}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProCapError(f"{flag} must be a finite number, got {value}.")
    if above is not None and not value > above:
        raise ProCapError(f"{flag} must be greater than {_shown(above)}, got {value}.")
    if minimum is not None and value < minimum:
        raise ProCapError(f"{flag} must be at least {_shown(minimum)}, got {value}.")
    if maximum is not None and value > maximum:
        raise ProCapError(f"{flag} must be at most {_shown(maximum)}, got {value}.")


def _shown(bound: float) -> str:
    """A bound as a message shows it: an integer in full with thousands separators (``10,000,000``, not ``1e+07``)."""
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


def integer(value: object, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` when it is an integer within the inclusive bounds: for arguments of the Python API, where a string
    or a float (``max_len="20"``, ``2.5``) would otherwise reach a comparison or ``range`` as a traceback.

    Raises:
        ProCapError: naming ``name`` and what it takes.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProCapError(f"{name} must be an integer, got {shown(value)}.")
    number(value, name, minimum=minimum, maximum=maximum)
    return value


# A decoding length counts BOS: 2 leaves one generated token, the shortest caption there is.
MIN_CAPTION_LENGTH = 2


def caption_length(value: object, name: str, ceiling: int | None = None, default: int | None = None) -> int | None:
    """``value`` as a decoding length (BOS included) in ``[2, ceiling]``, or ``default`` when it is None.

    The one range check of ``max_len`` / ``--max-len``: the commands (before a model is read, so without a
    ``ceiling``), ``ProCap.generate``, the ``Captioner`` and the decoders' caches (with the model's
    ``max_caption_len``) all call it, so each says the same sentence.

    Raises:
        ProCapError: naming ``name``: not an integer, or out of range.
    """
    if value is None:
        return default
    return integer(value, name, minimum=MIN_CAPTION_LENGTH, maximum=ceiling)


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (``procap prepare --shard``) -> ``(I, N)`` with ``0 <= I < N``; ProCapError naming ``--shard``
    otherwise. Here rather than beside the shards' code, which imports torch, so that it is checked before it."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match or not 0 <= int(match[1]) < int(match[2]):
        raise ProCapError(f"--shard {text!r}: give I/N with 0 <= I < N (e.g. 0/4 ... 3/4)")
    return int(match[1]), int(match[2])


def environment_integer(variable: str, default: int, minimum: int = 0) -> int:
    """The integer in the environment variable ``variable`` (``default`` when unset), checked: the library reads
    ``WORLD_SIZE`` and friends itself, so a bad value is named here rather than met as a ``ValueError``.

    Raises:
        ProCapError: naming the variable and its value.
    """
    raw = os.environ.get(variable)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ProCapError(f"environment variable {variable}={raw!r} must be an integer of at least {minimum}.")
    return value


def canonical_device(device):
    """``torch.device(device)`` with the CPU's index dropped: ``cpu:0`` is the one CPU, and tensors report
    ``cpu``, so a ``cpu:0`` kept as given compared unequal to the device of every tensor (a traceback in
    ``procap caption --device cpu:0``)."""
    import torch

    parsed = torch.device(device)
    return torch.device("cpu") if parsed.type == "cpu" else parsed


def device_index(device) -> int | None:
    """The index a device name means: the current device of its type when the name gives none (what PyTorch
    allocates on for ``cuda``), 0 for a type that has no notion of a current device, None for the CPU (one
    device, whatever index a name gives)."""
    import torch

    parsed = torch.device(device)
    if parsed.type == "cpu":
        return None
    if parsed.index is not None:
        return parsed.index
    if parsed.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def same_device(requested, actual) -> bool:
    """Whether ``requested`` names the device ``actual`` is (e.g. a tensor's ``.device``).

    The one device comparison of the package: ``torch.device("cuda") != torch.device("cuda:0")`` although a
    tensor made on ``cuda`` lives on ``cuda:0`` when 0 is current, and ``cpu:0`` is the CPU that tensors report
    as ``cpu``. Types must match; indices are compared after :func:`device_index` fills in the missing ones.
    """
    import torch

    requested, actual = torch.device(requested), torch.device(actual)
    return requested.type == actual.type and device_index(requested) == device_index(actual)


def device(name: str | torch.device | None, flag: str = "--device") -> torch.device:
    """Parse a device name and check that it exists on this machine.

    ``None`` and ``"auto"`` mean CUDA when available, else the CPU.

    Returns:
        The ``torch.device``.
    """
    import torch

    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(name)
    except (RuntimeError, ValueError):
        raise ProCapError(f"{flag} {name!r} is not a device name (try cpu or cuda).") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ProCapError(f"{flag} {name} was requested but no CUDA device is available.")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ProCapError(f"{flag} {name}: this machine has {torch.cuda.device_count()} CUDA device(s).")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ProCapError(f"{flag} {name} was requested but no MPS device is available.")
    elif parsed.type not in ("cpu", "mps"):
        raise ProCapError(f"{flag} {name}: only cpu, cuda and mps devices are supported.")
    return canonical_device(parsed)


# The seed range as keyword arguments of :func:`integer` (TrainConfig's table of integer fields takes them as they are).
SEED_BOUNDS = {"minimum": 0, "maximum": MAX_SEED}


def seed(value: object, name: str, count: int = 1) -> int | None:
    """``value`` when it is a seed, or the first of ``count`` consecutive seeds (``seed .. seed + count - 1``), that
    NumPy and torch both take; None (not given) passes. The one check of ``--seed`` / ``seed`` everywhere.

    Raises:
        ProCapError: naming ``name``: not an integer, negative, or past :data:`MAX_SEED` with its followers.
    """
    if value is None:
        return None
    return integer(value, name, minimum=SEED_BOUNDS["minimum"], maximum=SEED_BOUNDS["maximum"] + 1 - count)


# k, keyframes per pair, as keyword arguments of :func:`integer`: at most the most frames a procedure has (l).
KEYFRAME_BOUNDS = {"minimum": 0, "maximum": max(GENERATED_FRAME_COUNTS)}


def keyframe_count(value: object, name: str, frames: int | None = None) -> int | None:
    """``value`` when it is a keyframe count k, 0 to ``frames`` (the procedure's l; default the largest l there
    is); None (not given) passes. The one check of ``--num-keyframes`` (``-k``) and ``num_keyframes``.

    Raises:
        ProCapError: naming ``name``: not an integer, negative, or more keyframes than frames.
    """
    if value is None:
        return None
    count = integer(value, name, **KEYFRAME_BOUNDS)
    if frames is not None and count > frames:
        raise ProCapError(f"{name} must be at most l = {frames} (the procedure's frames), got {count}.")
    return count
