"""The child process that writes a procedure cache's group file: ``python -I group_rewrite.py < SPEC``.

HDF5 does not survive a write that fails part-way (a full disk, a quota, a file-size limit): the library is then
left in a state where its next flush, or its exit handler, crashes the interpreter (a segfault with HDF5 2.0 /
h5py 3.16), and a file it had open for writing may be unreadable. So the one large HDF5 write of the package, a
group file rewritten with the pairs written since (:func:`procap.procedure.cache.write_group_file`), runs in a
process of its own into a temporary file: its failure is an exit status and a line on stderr that the parent turns
into one sentence, and the group file in place is untouched until the rename. Only the standard library and h5py
are imported, so the child starts in a fraction of a second.

What to write comes on stdin as NUL-separated names (no path and no HDF5 name holds a NUL), in the bytes the OS
and HDF5 take: the target file, then a source file and one of its keys for each dataset, copied (its attributes
with it) into the target under the same name in that order; the parent names each key once.
"""

from __future__ import annotations

import os
import sys
from itertools import groupby

import h5py


def rewrite(target: str, sources: list[tuple[str, list[str]]]) -> None:
    """Write ``target`` anew with the datasets ``sources`` name, in order."""
    with h5py.File(target, "w") as out:
        for path, keys in sources:
            with h5py.File(path, "r") as source:
                for key in keys:
                    source.copy(source[key], out, name=key)


def read_spec(data: bytes) -> tuple[str, list[tuple[str, list[str]]]]:
    """The target and the ``(file, keys)`` sources from stdin's NUL-separated names."""
    target, *names = data.split(b"\0")
    entries = [
        (os.fsdecode(path), key.decode("utf-8", "surrogateescape")) for path, key in zip(names[::2], names[1::2])
    ]
    return os.fsdecode(target), [(path, [key for _, key in group]) for path, group in groupby(entries, lambda e: e[0])]


def main() -> int:
    """Run :func:`rewrite` on the names read from stdin; a failure is exit status 1 and its text on stderr."""
    target, sources = read_spec(sys.stdin.buffer.read())
    try:
        rewrite(target, sources)
    except Exception as exc:  # noqa: BLE001 - the parent reads the text (an errno in it) and says one sentence
        sys.stderr.write(" ".join(str(exc).split()) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
