"""``procap`` under torchrun with one fault at a chosen training step: the node tests/train/test_multinode.py breaks.

Usage: ``torchrun ... tests/train/faulty_node.py FAULT MARKER STEP train --data ...`` (``procap``'s own arguments
follow STEP). At the loss of optimizer step STEP the worker

* ``stall``: writes its pid to MARKER and sleeps, so the test can kill the node after the previous step's
  checkpoint was written and before the run ends, however fast the machine is;
* ``crash``: exits at once with status ``CRASHED`` (no cleanup, no word to the others, as a segfault), on rank 1
  and only in torchrun's first attempt, so a ``--max-restarts`` restart runs clean; MARKER is not used.

Everything else is the plain command: ``procap.commands.cli.main``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from procap.commands.cli import main
from procap.model.procap import ProCap

# Far longer than any of the test's timeouts: the test kills the process long before it wakes.
STALL_S = 3600
CRASHED = 3


def _announce(marker: Path) -> None:
    staged = marker.with_name(marker.name + ".tmp")
    staged.write_text(str(os.getpid()))
    os.replace(staged, marker)  # the test never reads a half-written pid


def fail_at(fault: str, step: int, marker: Path) -> None:
    """Make the ``step``-th stage-2 loss of this process stall or crash (see the module docstring)."""
    if fault not in ("stall", "crash"):
        raise SystemExit(f"faulty_node.py: unknown fault {fault!r}")
    original = ProCap.stage2_loss
    calls = 0

    def failing(self: ProCap, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == step and fault == "stall":
            _announce(marker)
            time.sleep(STALL_S)
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if calls == step and fault == "crash" and os.environ.get("RANK") == "1" and first_attempt:
            os._exit(CRASHED)
        return original(self, *args, **kwargs)

    ProCap.stage2_loss = failing  # type: ignore[method-assign]


if __name__ == "__main__":
    fault_arg, marker_arg, step_arg, *procap_args = sys.argv[1:]
    fail_at(fault_arg, int(step_arg), Path(marker_arg))
    sys.exit(main(procap_args))
