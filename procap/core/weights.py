"""Weight files without pickle: safetensors I/O below the model, for any module.

Every write goes to a temporary file first and is moved into place with ``os.replace``
(:func:`atomic_save_tensors`). Reads name the file in one sentence on failure (:func:`read_tensors`,
:func:`read_header`). safetensors refuses tensors that share storage, and ProCap ties its decoder input embedding
to the output projection; such aliases are stored once (:func:`dedupe_shared`) and re-attached on load
(:func:`restore_aliases`, ``aliases`` in the metadata). :func:`load_weights` checks names, shapes, kinds of number
and finiteness before ``load_state_dict``; :func:`save_module` / :func:`load_module_state` /
:func:`check_file_fits` serve any module with JSON metadata (the VQGAN's files); :func:`meta_build` builds a module's
shapes only, for that check and for parameter counts.

The ProCap checkpoint (config + vocabulary in the metadata) is :mod:`procap.model.checkpoint_file`, with the model
(:mod:`procap.loading.checkpoint` names ``ProCap`` for it, a level above); the resumable training state is
:mod:`procap.train.state`.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode

from procap.core.errors import ProCapError
from procap.core.files import atomic_write
from procap.core.json_files import parse_json
from procap.core.validate import input_file

# Floating-point formats a stored weight may have: the model casts them to its own dtype on load.
LOADABLE_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# The entries' uncompressed size over a zip archive's size: about 1 for torch.save's stored entries; a re-zipped
# checkpoint of float weights deflates by far less than this.
MAX_EXPANSION = 16


def check_zip_expansion(archive: zipfile.ZipFile, path: str | os.PathLike, what: str) -> None:
    """Refuse, before anything is decompressed, a torch zip archive whose entries declare more than
    :data:`MAX_EXPANSION` times the file's size (a zip bomb: a small file that inflates to all memory).

    zipfile, and torch's own reader, stop each entry at its declared size, so the declared sizes bound what reading
    the archive allocates.

    Raises:
        ProCapError: naming the file, the bytes declared and the entry that passed the ceiling.
    """
    size = os.path.getsize(path)
    total = 0
    for info in archive.infolist():
        total += info.file_size
        if total > MAX_EXPANSION * size:
            raise ProCapError(
                f"{what} {path} declares {total:,} bytes of content in {size:,} bytes of file (entry "
                f"{info.filename}), more than {MAX_EXPANSION} times its size; the file is malformed or a zip bomb."
            )


# ----------------------------------------------------------------------------------------------- atomic I/O
def atomic_save_tensors(
    path: Path | str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file`` through a temporary file; tensors are made contiguous on the CPU."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _unreadable(path: Path, what: str, exc: Exception) -> ProCapError:
    """The one-sentence error for a file safetensors cannot open; a PyTorch pickle (the authors' ``.chkpt``, a
    ``torch.save`` file) is named as such, with the command that converts it."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        head = b""
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch.save's zip archive, or a bare pickle
        return ProCapError(
            f"{what} file {path} is a PyTorch pickle, not a safetensors checkpoint; if it is the authors' released "
            f"checkpoint, convert it with `procap convert --from authors {path} --vocab WORD2IDX.json "
            f"--out model.safetensors`."
        )
    return ProCapError(f"{what} file {path} is not a readable safetensors file ({exc})")


def read_tensors(path: Path | str, what: str = "checkpoint") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load all tensors and the header metadata of a safetensors file, with a one-sentence error on failure."""
    path = input_file(path, f"{what} file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _unreadable(path, what, exc) from None
    return tensors, metadata


def read_header(path: Path | str, what: str = "checkpoint") -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Tensor shapes and header metadata of a safetensors file, without reading the tensors."""
    path = input_file(path, f"{what} file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _unreadable(path, what, exc) from None
    return shapes, metadata


# ----------------------------------------------------------------------------------------------- tied weights
def dedupe_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one copy of tensors that share storage; return ``(tensors, aliases)`` with alias -> kept name.

    The first name in state-dict order is kept, so the choice is deterministic across save/load cycles.
    """
    kept: dict[tuple, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            tensors[name] = tensor
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in kept:
            aliases[name] = kept[key]
        else:
            kept[key] = name
            tensors[name] = tensor
    return tensors, aliases


def restore_aliases(tensors: dict[str, Any], aliases: dict[str, str], path: Path | str = "") -> dict[str, Any]:
    """Re-attach tied tensors; ``aliases`` is decoded metadata, so it is checked (alias -> stored name)."""
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise ProCapError(f"file {path} has malformed 'aliases' metadata (expected names of stored tensors)")
    out = dict(tensors)
    for alias, name in aliases.items():
        if name not in tensors:
            raise ProCapError(f"file {path} ties {alias!r} to {name!r}, which is not stored in it")
        out[alias] = tensors[name]
    return out


# ----------------------------------------------------------------------------------------------- checks and module files
def check_shapes(own: dict[str, Any], stored: dict[str, Any], path: Path | str) -> None:
    """Names and shapes of ``stored`` (tensors or shape tuples) must match the model's ``own`` state dict.

    Raises:
        ProCapError: naming missing, unexpected and wrong-shaped entries in one sentence.
    """

    def shape(value: Any) -> tuple[int, ...]:
        return tuple(value.shape) if hasattr(value, "shape") else tuple(value)

    missing = sorted(set(own) - set(stored))
    unexpected = sorted(set(stored) - set(own))
    wrong = sorted(k for k in set(own) & set(stored) if shape(own[k]) != shape(stored[k]))
    if missing or unexpected or wrong:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
            if keys:
                parts.append(f"{len(keys)} {label} (e.g. {', '.join(keys[:3])})")
        raise ProCapError(f"weights in {path} do not fit the model: {'; '.join(parts)}")


def check_finite(state: dict[str, torch.Tensor], path: Path | str) -> None:
    """Floating-point weights must be finite: NaN weights caption '' (or garbage) without any error.

    Raises:
        ProCapError: naming the file and the first tensors holding NaN or infinite values.
    """
    bad = [
        name
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and not value.is_meta  # shapes only (key-list checks): no values to test
        and not bool(torch.isfinite(value).all())
    ]
    if bad:
        raise ProCapError(
            f"weights in {path} hold NaN or infinite values ({len(bad)} tensors, e.g. {', '.join(bad[:3])}); "
            f"the run that saved them probably diverged."
        )


def check_dtypes(own: dict[str, torch.Tensor], stored: dict[str, torch.Tensor], path: Path | str) -> None:
    """Each stored tensor must be of the model's kind of number: ``load_state_dict`` casts an integer tensor into
    float weights (and floats into integer buffers) silently, and the model then captions garbage.

    Float widths may differ (an fp16 or bf16 file loads into fp32 weights); the float8 formats may not (PyTorch
    cannot even test them for NaN, and a quantized file needs its scales, which a plain cast drops).

    Raises:
        ProCapError: naming the first tensor whose kind differs, with both dtypes.
    """

    def kind(tensor: torch.Tensor) -> str:
        if tensor.is_floating_point():
            return "floating-point"
        return "complex" if tensor.is_complex() else "integer" if tensor.dtype != torch.bool else "boolean"

    for name, value in stored.items():
        mine = own.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype not in LOADABLE_FLOATS:
            raise ProCapError(
                f"weights in {path}: tensor {name} is {str(value.dtype).removeprefix('torch.')}, which the model "
                f"cannot load (it takes {', '.join(str(d).removeprefix('torch.') for d in LOADABLE_FLOATS)}); "
                "convert the file's weights to one of them."
            )
        if isinstance(value, torch.Tensor) and isinstance(mine, torch.Tensor) and kind(value) != kind(mine):
            raise ProCapError(
                f"weights in {path}: tensor {name} is {str(value.dtype).removeprefix('torch.')} where the model "
                f"holds {kind(mine)} values ({str(mine.dtype).removeprefix('torch.')}); the file was not written "
                "for this model or was altered."
            )


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], path: Path | str) -> None:
    """``load_state_dict(strict=True)`` with missing/unexpected keys, shape mismatches, tensors of the wrong kind
    of number and non-finite values named in one sentence."""
    own = module.state_dict()
    check_shapes(own, state, path)
    check_dtypes(own, state, path)
    check_finite(state, path)
    module.load_state_dict(state, strict=True)


def save_module(path: Path | str, module: torch.nn.Module, metadata: dict[str, Any]) -> Path:
    """Save any module's weights (e.g. a VQGAN) with JSON metadata values, deduplicating tied tensors."""
    tensors, aliases = dedupe_shared(module.state_dict())
    meta = {key: json.dumps(value) for key, value in metadata.items()}
    meta["aliases"] = json.dumps(aliases)
    atomic_save_tensors(path, tensors, meta)
    return Path(path)


# The in-place random fills of a tensor. On the meta device PyTorch runs them through its Python references
# (torch._refs), whose first call imports torch._dynamo: seconds on an idle machine, half a minute on a loaded one,
# for values a meta tensor does not have.
_RANDOM_FILLS = frozenset(
    getattr(torch.Tensor, name)
    for name in ("normal_", "uniform_", "random_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_")
)


class _NoFillsOnMeta(TorchFunctionMode):
    """Skips initialisation on meta tensors: every ``torch.nn.init`` function and random fill given a meta tensor
    returns it untouched. A meta tensor has a shape and no values, so nothing a build produces changes."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # nn.init functions are also called with tensor=...
        is_fill = func in _RANDOM_FILLS or getattr(func, "__module__", None) == "torch.nn.init"
        if is_fill and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_build() -> Iterator[None]:
    """Modules built inside are on the meta device, their initialisation skipped: shapes only, nothing allocated,
    and no ``torch._dynamo`` import (:data:`_RANDOM_FILLS`); a fraction of a second for the paper's model."""
    with torch.device("meta"), _NoFillsOnMeta():
        yield


def check_file_fits(path: Path | str, build: Any, what: str = "weights") -> None:
    """Compare the tensor names and shapes stored in ``path`` with ``build()``'s, built by :func:`meta_build`.

    Nothing is allocated, so a file whose metadata describes an absurdly large module fails here cheaply.

    Args:
        path: a safetensors file written by :func:`save_module` (or :func:`save_checkpoint`).
        build: zero-argument callable returning the module the file should fit.
        what: how messages name the file.
    """
    shapes, raw = read_header(path, what)
    aliases = parse_json(raw.get("aliases", "{}"), f"the aliases metadata of {what} file {path}")
    with meta_build():
        try:
            module = build()
        except (ValueError, RuntimeError, TypeError, ZeroDivisionError) as exc:  # e.g. channels vs GroupNorm groups
            raise ProCapError(f"{what} file {path} describes a model that cannot be built ({exc})") from None
        check_shapes(module.state_dict(), restore_aliases(shapes, aliases, path), path)


def load_module_state(path: Path | str, what: str = "weights") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Counterpart of :func:`save_module`: ``(state_dict, metadata)`` with aliases restored and JSON decoded."""
    tensors, raw = read_tensors(path, what)
    meta = {key: parse_json(value, f"the {key} metadata of {what} file {path}") for key, value in raw.items()}
    return restore_aliases(tensors, meta.pop("aliases", {}), path), meta
