"""Resumable training state beside a model checkpoint: optimizer moments, RNG streams and scalars.

The state lives beside the weights: ``<stem>.state.safetensors`` for the tensors and ``<stem>.state.json`` for
the structure and scalars (step, epoch, schedule, best metric...). Every write goes to a temporary file first
and is moved into place with ``os.replace``.

Weights and state are one unit (:func:`commit_resumable`): all three files are written into a staging folder
beside them, ``.<checkpoint>.saving``, which one rename makes the committed ``.<checkpoint>.saved``; its files are
then moved into place. A process killed at any moment therefore leaves either the previous pair whole (and a
staging folder, deleted by the next save or resume) or a committed folder, whose files the next save or resume
moves into place (:func:`recover_resumable`). One rename per file could not do this: ``kill -9`` between the
weights' and the state's left step-N weights beside step-(N-1) optimizer and RNG state, and ``--resume`` trained a
model no uninterrupted run would have. The state also records the size and SHA-256 of the weights it was saved
with, and :func:`load_training_state` refuses weights that are not those (files copied by hand, a pair torn by an
older version, whose state records no hash: there the steps recorded in both files are compared).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from procap.core.errors import ProCapError
from procap.core.files import UNIT_COMMITTED, atomic_write_json, beside, commit_unit, recover_unit, sha256_of
from procap.core.json_files import parse_json, read_json
from procap.core.weights import atomic_save_tensors, read_header, read_tensors
from procap.loading.checkpoint import FORMAT


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
    numpy_state = np.random.get_state()
    # the global RandomState is MT19937, whose state is this tuple (a dict is for other bit generators)
    assert isinstance(numpy_state, tuple)
    kind, keys, pos, has_gauss, cached = numpy_state
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
    a state that :func:`load_training_state` rejects instead of silently mixing two steps. It also records
    :func:`weights_fingerprint` of ``checkpoint``, which must therefore be written first (a training run writes
    both through :func:`commit_resumable`).

    Args:
        rank_rngs: for a data-parallel job, every rank's :func:`capture_rng_state` in rank order (rank 0 first,
            this process); stored as ``rank<r>/rng/...`` so that each rank resumes its own streams.
    """
    tensor_path, json_path = state_paths(checkpoint)
    optim_tensors, optim_skeleton = _flatten_optimizer(optimizer.state_dict())
    rng_tensors, rng_scalars = capture_rng_state() if rank_rngs is None else rank_rngs[0]
    extra_tensors: dict[str, torch.Tensor] = {}
    extra_scalars: dict[str, dict[str, Any]] = {}
    for rank, (tensors, rank_scalars) in enumerate(rank_rngs or []):
        if rank > 0:
            extra_tensors.update({f"rank{rank}/{k}": v for k, v in tensors.items()})
            extra_scalars[str(rank)] = rank_scalars
    token = f"{scalars.get('step', 0)}-{os.urandom(8).hex()}"  # os.urandom: must not advance the RNGs saved above
    atomic_save_tensors(tensor_path, {**optim_tensors, **rng_tensors, **extra_tensors}, {"token": token})
    payload = {"format": FORMAT, "token": token, "optimizer": optim_skeleton, "rng": rng_scalars, **scalars}
    world = len(rank_rngs) if rank_rngs else 1  # one process saves its own streams only
    payload.update(world=world, rank_rng=extra_scalars, weights=weights_fingerprint(checkpoint))
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
    _check_weights_belong(Path(checkpoint), payload)
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
    internal = ("optimizer", "rng", "token", "format", "rank_rng", "weights")
    return {k: v for k, v in payload.items() if k not in internal}


# ----------------------------------------------------------------------------------------------- weights and state as one
def weights_fingerprint(checkpoint: Path | str) -> dict[str, Any] | None:
    """``{"bytes", "sha256"}`` of the weights file ``checkpoint``, or None where there is none (a state saved alone).

    A hash, not the step: two saves at one step (the last step's periodic and final saves) or two runs hold other
    weights under the same step.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        return None
    return {"bytes": checkpoint.stat().st_size, "sha256": sha256_of(checkpoint)}


def _recorded_step(checkpoint: Path) -> Any:
    """The ``step`` a training run wrote into the weights' ``extra`` metadata (ProCap and VQGAN files), or None."""
    try:
        extra = parse_json(read_header(checkpoint, "checkpoint")[1].get("extra", "{}"), f"checkpoint file {checkpoint}")
    except ProCapError:
        return None  # loading the weights names what is wrong with the file
    return extra.get("step") if isinstance(extra, dict) else None


def _check_weights_belong(checkpoint: Path, payload: dict[str, Any]) -> None:
    """Refuse a training state beside weights it was not saved with: resuming would continue a model that no
    uninterrupted run trained (the module docstring)."""
    if not checkpoint.is_file():
        return  # a state saved alone (tests, tools): there are no weights to mix with it
    recorded = payload.get("weights")
    if recorded is not None:
        # the size first: a different size tells without reading the file
        belongs = checkpoint.stat().st_size == recorded.get("bytes") and weights_fingerprint(checkpoint) == recorded
    else:  # a state from before the hash was recorded: the steps both files record are what can be compared
        weights_step = _recorded_step(checkpoint)
        belongs = weights_step is None or weights_step == payload.get("step")
    if not belongs:
        _tensor_path, json_path = state_paths(checkpoint)
        weights_step = _recorded_step(checkpoint)
        at = f" (step {weights_step})" if weights_step is not None else ""
        raise ProCapError(
            f"cannot resume from {checkpoint.parent}: its {checkpoint.name}{at} is not the checkpoint that "
            f"{json_path.name} (step {payload.get('step')}) was saved with, so continuing would train a model no "
            "run trained; start the run again, or put back both files from one save."
        )


def has_resumable(checkpoint: Path | str) -> bool:
    """``checkpoint`` has weights and a training state to resume: in place, or committed and not yet moved there."""
    checkpoint = Path(checkpoint)
    in_place = checkpoint.is_file() and state_paths(checkpoint)[1].is_file()
    return in_place or beside(checkpoint, UNIT_COMMITTED).is_dir()


def _unit_names(checkpoint: Path) -> list[str]:
    """The files of one save, in the order they are moved into place: the JSON, which names the others, last."""
    tensor_path, json_path = state_paths(checkpoint)
    return [checkpoint.name, tensor_path.name, json_path.name]


def recover_resumable(checkpoint: Path | str) -> str | None:
    """Finish what a save of ``checkpoint`` killed part-way left (:func:`commit_resumable`): a committed save is moved
    into place, an uncommitted one deleted (the pair in place is then the previous save, whole).

    Only for the one writer of the folder (a run holding its lock): a live save looks the same.

    Returns:
        A sentence saying which save the folder now holds, or None when nothing was left.
    """
    checkpoint = Path(checkpoint)
    done = recover_unit(checkpoint, _unit_names(checkpoint))
    if not done:
        return None
    json_path = state_paths(checkpoint)[1]
    payload = read_json(json_path, "training state file") if json_path.is_file() else None
    step = payload.get("step") if isinstance(payload, dict) else None
    held = f"; {checkpoint.parent} holds the save of step {step}" if step is not None else ""
    return " and ".join(done) + held


def commit_resumable(checkpoint: Path | str, write: Callable[[Path], None]) -> None:
    """Write weights and training state as one unit (the module docstring).

    Args:
        checkpoint: where the weights go; the state goes beside it (:func:`state_paths`).
        write: ``write(staged)`` writes the weights to ``staged`` and then the state beside it
            (:func:`save_training_state` of ``staged``); ``staged`` lies in a staging folder beside ``checkpoint``.

    Raises:
        OutputError: the operating system refused a write, naming the file in place, never the staging folder.
    """
    checkpoint = Path(checkpoint)
    commit_unit(checkpoint, _unit_names(checkpoint), lambda staging: write(staging / checkpoint.name))
