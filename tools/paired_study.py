"""Paired comparisons of a finished ``procap demo`` folder: ProCap minus each other cell of the 2 x 2.

    python tools/paired_study.py runs/demo [runs/demo-distractor ...]

Prints the table ``procap demo`` prints at its end and writes ``paired.json`` into each folder; for folders made
before the demo computed it itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json
from procap.experiments.demo import format_paired, paired_from_folder


def main(folders: list[str]) -> int:
    if not folders:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for folder in folders:
        try:
            rows = paired_from_folder(folder)
        except ProCapError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        atomic_write_json(Path(folder) / "paired.json", rows, indent=1)
        print(f"{folder}:\n{format_paired(rows)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
