"""Checkpoints without pickle: model weights in safetensors, training state in safetensors + JSON.

A model checkpoint is one ``.safetensors`` file. Its header metadata (string -> string) carries everything
needed to rebuild the model: the :class:`~procap.config.ProCapConfig` as JSON, the vocabulary as a JSON
word -> index map, the names of tied (shared) tensors, and free-form ``extra`` JSON (step, metrics...).
Loading reads tensors and JSON only, so opening an untrusted checkpoint runs no code.

safetensors refuses tensors that share storage, and ProCap ties its decoder input embedding to the output
projection; such aliases are stored once and re-attached on load (``aliases`` in the metadata).

The resumable training state (optimizer moments, schedule step, epoch, RNG states, best metric) lives beside
the weights: ``<stem>.state.safetensors`` for the tensors and ``<stem>.state.json`` for the structure and
scalars. Every write goes to a temporary file first and is moved into place with ``os.replace``.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from procap.errors import ProCapError
from procap.files import atomic_write, atomic_write_json
from procap.validate import input_file

FORMAT = "procap"
FORMAT_VERSION = "1"


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


def _restore_aliases(tensors: dict[str, Any], aliases: dict[str, str], path: Path | str = "") -> dict[str, Any]:
    """Re-attach tied tensors; ``aliases`` is decoded metadata, so it is checked (alias -> stored name)."""
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise ProCapError(f"file {path} has malformed 'aliases' metadata (expected names of stored tensors)")
    out = dict(tensors)
    for alias, name in aliases.items():
        if name not in tensors:
            raise ProCapError(f"file {path} ties {alias!r} to {name!r}, which is not stored in it")
        out[alias] = tensors[name]
    return out


# ----------------------------------------------------------------------------------------------- vocabulary
def vocab_to_dict(vocab: Any) -> dict[str, int]:
    """Word -> index map of a :class:`procap.data.Vocabulary` through its own JSON ``save``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.json"
        vocab.save(path)
        return json.loads(path.read_text(encoding="utf-8"))


def vocab_from_dict(word2idx: dict[str, int], source: str = "vocabulary") -> Any:
    """Rebuild a :class:`procap.data.Vocabulary` from a word -> index map; errors name ``source``."""
    from procap.data import Vocabulary

    return Vocabulary.from_dict(word2idx, source)


# ----------------------------------------------------------------------------------------------- model files
def save_checkpoint(path: Path | str, model: torch.nn.Module, vocab: Any, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (a ProCap), its config and ``vocab`` to one safetensors file, atomically.

    Args:
        path: destination ``.safetensors`` file; parent folders are created.
        model: a :class:`procap.model.procap.ProCap` with a ``config`` attribute.
        vocab: the :class:`procap.data.Vocabulary` the model was trained with.
        extra: JSON-serialisable facts to keep with the weights (step, stage, validation metrics...).

    Returns:
        The path written.
    """
    tensors, aliases = dedupe_shared(model.state_dict())
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": json.dumps(model.config.to_dict()),
        "vocab": json.dumps(vocab_to_dict(vocab)),
        "aliases": json.dumps(aliases),
        "extra": json.dumps(extra or {}),
    }
    atomic_save_tensors(path, tensors, metadata)
    return Path(path)


def read_checkpoint_metadata(path: Path | str) -> dict[str, Any]:
    """Decoded metadata of a ProCap checkpoint (``config``, ``vocab``, ``extra``, ``aliases``) without the weights."""
    _, raw = read_header(path)
    return _decode_metadata(Path(path), raw)


def _decode_metadata(path: Path, raw: dict[str, str]) -> dict[str, Any]:
    if raw.get("format") != FORMAT or "config" not in raw or "vocab" not in raw:
        raise ProCapError(f"checkpoint file {path} is not a ProCap checkpoint (no config/vocabulary in its metadata)")
    try:
        decoded = {
            key: json.loads(raw[key]) if key in ("config", "vocab", "aliases", "extra") else raw[key] for key in raw
        }
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProCapError(f"checkpoint file {path} has malformed JSON metadata ({exc})") from None
    for key in ("config", "vocab"):
        if not isinstance(decoded[key], dict):
            raise ProCapError(f"checkpoint file {path} has a {key} that is not a JSON object")
    return decoded


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> tuple[Any, Any, dict[str, Any]]:
    """Rebuild a ProCap model and its vocabulary from a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the ``.safetensors`` file.
        map_location: device for the returned model.

    Returns:
        ``(model, vocab, metadata)``: the model in eval mode on ``map_location``, the Vocabulary, and the
        decoded metadata dict (``config``, ``vocab``, ``extra``, ...).

    Raises:
        ProCapError: the file is missing, unreadable, not a ProCap checkpoint, or its tensors do not fit the config.
    """
    from procap.config import ProCapConfig, config_from_dict
    from procap.model.procap import ProCap

    path = Path(path)
    _, raw = read_header(path)
    metadata = _decode_metadata(path, raw)
    try:
        config = config_from_dict(ProCapConfig, metadata["config"])
    except ValueError as exc:
        raise ProCapError(f"checkpoint file {path} holds an invalid config ({exc})") from None
    vocab = vocab_from_dict(metadata["vocab"], f"the vocabulary in checkpoint file {path}")
    if len(vocab) != config.vocab_size:
        raise ProCapError(
            f"checkpoint file {path} holds {len(vocab)} vocabulary entries for a model of {config.vocab_size}"
        )
    aliases = metadata.get("aliases", {})
    check_file_fits(path, lambda: ProCap(config), "checkpoint")  # before a single weight is allocated
    tensors, _ = read_tensors(path)
    model = ProCap(config)
    load_weights(model, _restore_aliases(tensors, aliases, path), path)
    model.to(map_location).eval()
    return model, vocab, metadata


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

    Float widths may differ (an fp16 or bf16 file loads into fp32 weights).

    Raises:
        ProCapError: naming the first tensor whose kind differs, with both dtypes.
    """

    def kind(tensor: torch.Tensor) -> str:
        if tensor.is_floating_point():
            return "floating-point"
        return "complex" if tensor.is_complex() else "integer" if tensor.dtype != torch.bool else "boolean"

    for name, value in stored.items():
        mine = own.get(name)
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


def check_file_fits(path: Path | str, build: Any, what: str = "weights") -> None:
    """Compare the tensor names and shapes stored in ``path`` with ``build()``'s, built on the meta device.

    Nothing is allocated, so a file whose metadata describes an absurdly large module fails here cheaply.

    Args:
        path: a safetensors file written by :func:`save_module` (or :func:`save_checkpoint`).
        build: zero-argument callable returning the module the file should fit.
        what: how messages name the file.
    """
    shapes, raw = read_header(path, what)
    try:
        aliases = json.loads(raw.get("aliases", "{}"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProCapError(f"{what} file {path} has malformed JSON metadata ({exc})") from None
    with torch.device("meta"):
        try:
            module = build()
        except (ValueError, RuntimeError, TypeError, ZeroDivisionError) as exc:  # e.g. channels vs GroupNorm groups
            raise ProCapError(f"{what} file {path} describes a model that cannot be built ({exc})") from None
        check_shapes(module.state_dict(), _restore_aliases(shapes, aliases, path), path)


def load_module_state(path: Path | str, what: str = "weights") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Counterpart of :func:`save_module`: ``(state_dict, metadata)`` with aliases restored and JSON decoded."""
    tensors, raw = read_tensors(path, what)
    try:
        meta = {key: json.loads(value) for key, value in raw.items()}
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProCapError(f"{what} file {path} has malformed JSON metadata ({exc})") from None
    return _restore_aliases(tensors, meta.pop("aliases", {}), path), meta


# ----------------------------------------------------------------------------------------------- training state
def state_paths(checkpoint: Path | str) -> tuple[Path, Path]:
    """``(<stem>.state.safetensors, <stem>.state.json)`` next to a model checkpoint."""
    checkpoint = Path(checkpoint)
    stem = checkpoint.name.removesuffix(".safetensors")
    return checkpoint.with_name(f"{stem}.state.safetensors"), checkpoint.with_name(f"{stem}.state.json")


def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer ``state_dict`` into tensors (``optim/<param>/<key>``) and a JSON-able skeleton."""
    tensors: dict[str, torch.Tensor] = {}
    per_param: dict[str, dict[str, Any]] = {}
    for index, slots in state["state"].items():
        entry: dict[str, Any] = {}
        for key, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"optim/{index}/{key}"] = value
                entry[key] = {"tensor": f"optim/{index}/{key}"}
            else:
                entry[key] = value
        per_param[str(index)] = entry
    return tensors, {"state": per_param, "param_groups": state["param_groups"]}


def _unflatten_optimizer(skeleton: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    state = {}
    for index, entry in skeleton["state"].items():
        state[int(index)] = {
            k: tensors[v["tensor"]] if isinstance(v, dict) and "tensor" in v else v for k, v in entry.items()
        }
    groups = []
    for group in skeleton["param_groups"]:
        # JSON turns tuples into lists; AdamW expects ``betas`` as a tuple.
        groups.append({k: tuple(v) if k == "betas" else v for k, v in group.items()})
    return {"state": state, "param_groups": groups}


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Python, NumPy, torch CPU and CUDA generator states as (uint8/int64 tensors, JSON scalars)."""
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng/numpy"] = torch.from_numpy(keys.astype(np.int64))
    version, pystate, gauss_next = random.getstate()
    tensors["rng/python"] = torch.tensor(pystate, dtype=torch.int64)
    scalars = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": [version, gauss_next]}
    return tensors, scalars


def restore_rng_state(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(tensors["rng/torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in sorted(cuda, key=lambda k: int(k.rsplit("/", 1)[1]))])
    kind, pos, has_gauss, cached = scalars["numpy"]
    np.random.set_state((kind, tensors["rng/numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, gauss_next = scalars["python"]
    random.setstate((version, tuple(int(x) for x in tensors["rng/python"].tolist()), gauss_next))


def save_training_state(
    checkpoint: Path | str,
    optimizer: torch.optim.Optimizer,
    scalars: dict[str, Any],
    rank_rngs: list[tuple[dict[str, torch.Tensor], dict[str, Any]]] | None = None,
) -> None:
    """Write the optimizer, RNG states and ``scalars`` (step, epoch, schedule, best metric...) beside ``checkpoint``.

    The JSON file is written last and names the tensor file's step, so a crash between the two writes leaves
    a state that :func:`load_training_state` rejects instead of silently mixing two steps.

    Args:
        rank_rngs: for a data-parallel job, every rank's :func:`capture_rng_state` in rank order (rank 0 first,
            this process); stored as ``rank<r>/rng/...`` so that each rank resumes its own streams.
    """
    tensor_path, json_path = state_paths(checkpoint)
    optim_tensors, optim_skeleton = _flatten_optimizer(optimizer.state_dict())
    rng_tensors, rng_scalars = capture_rng_state() if rank_rngs is None else rank_rngs[0]
    extra_tensors, extra_scalars = {}, {}
    for rank, (tensors, rank_scalars) in enumerate(rank_rngs or []):
        if rank > 0:
            extra_tensors.update({f"rank{rank}/{k}": v for k, v in tensors.items()})
            extra_scalars[str(rank)] = rank_scalars
    token = f"{scalars.get('step', 0)}-{os.urandom(8).hex()}"  # os.urandom: must not advance the RNGs saved above
    atomic_save_tensors(tensor_path, {**optim_tensors, **rng_tensors, **extra_tensors}, {"token": token})
    payload = {"format": FORMAT, "token": token, "optimizer": optim_skeleton, "rng": rng_scalars, **scalars}
    payload.update(world=len(rank_rngs or [None]), rank_rng=extra_scalars)
    atomic_write_json(json_path, payload, indent=1)


def load_training_state(
    checkpoint: Path | str, optimizer: torch.optim.Optimizer | None = None, restore_rng: bool = True, rank: int = 0
) -> dict[str, Any]:
    """Restore what :func:`save_training_state` wrote; returns the scalars (``step``, ``epoch``, ...).

    ``rank`` picks which data-parallel rank's RNG streams are restored (0: the single-process ones).

    Raises:
        ProCapError: the state files are missing, unreadable or from a different save than each other.
    """
    tensor_path, json_path = state_paths(checkpoint)
    if not json_path.is_file():
        raise ProCapError(f"training state file {json_path} does not exist; cannot resume from {checkpoint}")
    try:
        payload = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProCapError(f"training state file {json_path} is not valid JSON ({exc})") from None
    tensors, meta = read_tensors(tensor_path, "training state")
    if meta.get("token") != payload.get("token"):
        raise ProCapError(f"training state files {tensor_path} and {json_path} come from different saves")
    if optimizer is not None:
        optimizer.load_state_dict(_unflatten_optimizer(payload["optimizer"], tensors))
    if restore_rng and rank == 0:
        restore_rng_state(tensors, payload["rng"])
    elif restore_rng:
        if str(rank) not in payload.get("rank_rng", {}):
            raise ProCapError(
                f"{json_path} was saved by {payload.get('world', 1)} process(es); resume with the same number"
            )
        prefix = f"rank{rank}/"
        own = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        restore_rng_state(own, payload["rank_rng"][str(rank)])
    return {k: v for k, v in payload.items() if k not in ("optimizer", "rng", "token", "format", "rank_rng")}
