"""Resumable training state beside a model checkpoint: optimizer moments, RNG streams and scalars.

The state lives beside the weights: ``<stem>.state.safetensors`` for the tensors and ``<stem>.state.json`` for
the structure and scalars (step, epoch, schedule, best metric...). Every write goes to a temporary file first
and is moved into place with ``os.replace``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from procap.checkpoint import FORMAT
from procap.errors import ProCapError
from procap.files import atomic_write_json
from procap.json_files import read_json
from procap.weights import atomic_save_tensors, read_tensors


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
    payload = read_json(json_path, "training state file")
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
