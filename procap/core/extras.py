"""Optional dependencies: which extra of the distribution brings each one, and a one-sentence error when it is missing.

The core install (torch, numpy, pillow, safetensors, tqdm) captions images. Training, metrics, the Hub and run
tracking each need packages from an extra; importing one that is absent says which extra to install, never a
bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from types import ModuleType

from procap.core.errors import ProCapError

DISTRIBUTION = "procap-torch"  # the name on PyPI ("procap" there is an unrelated package); `import procap` is kept

# top-level module -> the extra that installs it
EXTRA_OF_MODULE: dict[str, str] = {
    "h5py": "train",
    "cv2": "train",
    "matplotlib": "train",
    "yaml": "train",
    "pycocoevalcap": "eval",
    "huggingface_hub": "hub",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "pytest_benchmark": "bench",
    "pynvml": "bench",
    "timm": "dinov2",
    "flash_attn": "flash",
    "xformers": "xformers",
}


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_extra_message(module: str, purpose: str | None = None) -> str | None:
    """One sentence naming the extra that provides ``module`` (a dotted name is reduced to its top level);
    None when the module belongs to no extra."""
    top = module.split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    need = f"{purpose} needs" if purpose else "this needs"
    return f"{need} the optional package {top}, from the [{extra}] extra: {install_hint(extra)}."


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`ProCapError` naming the extra to install.

    Args:
        module: the module to import (``"huggingface_hub"``, ``"pycocoevalcap.bleu.bleu"``...).
        purpose: what needs it, for the message (``"the Hugging Face Hub"``).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc.name or module, purpose)
        if message is None:
            raise
        raise ProCapError(message) from None


def is_installed(module: str) -> bool:
    """Whether ``module`` (its top-level package) can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):  # a package whose import machinery is broken counts as missing
        return False


def require_all(needs: Mapping[str, str], command: str) -> None:
    """Check before any work that every optional package a command will import is installed.

    A command that needs an extra only later (metrics at the first validation, the report at the end) would
    otherwise stop after minutes of work.

    Args:
        needs: top-level module -> what needs it (``{"pycocoevalcap": "the validation scores"}``).
        command: the command, for the message (``"procap train"``).

    Raises:
        ProCapError: one sentence naming every missing package, what needs it and the extras to install.
    """
    missing = {module: purpose for module, purpose in needs.items() if not is_installed(module)}
    if not missing:
        return
    extras = sorted({EXTRA_OF_MODULE.get(module.split(".")[0], "all") for module in missing})
    packages = " and ".join(f"{module} ({purpose})" for module, purpose in missing.items())
    plural = "s" if len(missing) > 1 else ""
    raise ProCapError(
        f"{command} needs the optional package{plural} {packages}, from the {' and '.join(f'[{e}]' for e in extras)} "
        f"extra{'s' if len(extras) > 1 else ''}: {install_hint(','.join(extras))}."
    )
