"""The Hub flags of every command that takes ``--ckpt`` (``caption``, ``evaluate``, ``imagine``, ``profile``), and
the one call that turns ``--ckpt`` into a local checkpoint file with them. Imports nothing heavy: ``--help`` stays
fast, and a missing local ``--ckpt`` is refused before torch is imported (:func:`local_checkpoint`)."""

from __future__ import annotations

import argparse
from pathlib import Path

# what --ckpt takes, as every command that has one says it (procap.core.hub_files.resolve_checkpoint reads them)
CHECKPOINT_HELP = (
    "a checkpoint: a .safetensors file, a pretrained folder or hf://owner/repo[@revision] (written by procap train, "
    "procap convert or save_pretrained)"
)


def add_hub_arguments(parser: argparse.ArgumentParser) -> None:
    """``--hf-token`` and ``--force-download``, applied when ``--ckpt`` is ``hf://owner/repo[@revision]``."""
    group = parser.add_argument_group("Hugging Face Hub (when --ckpt is hf://owner/repo[@revision])")
    group.add_argument(
        "--hf-token",
        default=None,
        metavar="TOKEN",
        help="access token for a private or gated repo (default: the saved login or HF_TOKEN)",
    )
    group.add_argument(
        "--force-download",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="fetch the files again even when the Hub cache holds them (default: no)",
    )


def checkpoint_file(args: argparse.Namespace, what: str = "--ckpt") -> Path:
    """The local ``.safetensors`` file behind ``args.ckpt``, downloaded with the Hub flags when it is ``hf://``."""
    from procap.core.hub_files import resolve_checkpoint

    return resolve_checkpoint(args.ckpt, what, token=args.hf_token, force_download=args.force_download)


def local_checkpoint(args: argparse.Namespace, what: str = "--ckpt") -> Path | None:
    """The checkpoint file behind a local ``args.ckpt``, checked without torch and without a download; None for
    ``hf://``, whose syntax is checked here and whose files :func:`checkpoint_file` fetches once the checks that need
    torch (the device) have passed."""
    from procap.core.hub_files import parse_hub_path

    if parse_hub_path(args.ckpt, what) is not None:
        return None
    return checkpoint_file(args, what)
