"""Can a batch fit in memory? A rough lower bound of the bytes one batch takes, checked before any work.

A ``--batch-size`` far beyond what the machine holds used to start (read the data, build the model) and then end
minutes later in the kernel's out-of-memory killer or a CUDA out-of-memory traceback. Every command that takes
``--batch-size`` (``caption``, ``evaluate``, ``profile``, ``vqgan``, ``pretrain``, ``train``) now refuses such a
value up front with one sentence, using :func:`check_batch`.

The estimate (:func:`batch_bytes`) is deliberately a *lower* bound, so that nothing that would fit is refused:

- pixels: every image of the batch as float32 (3 x S x S x 4 bytes), S the model's image size;
- tokenizer: one full-resolution feature map of the VQGAN's first layer per image (``ch`` x S x S), held by
  whichever layer runs;
- training the VQGAN itself (``procap vqgan``): what autograd keeps for the backward pass, counted by running the
  loss of the configured VQGAN on PyTorch's meta device (shapes only: nothing is allocated, a fraction of a second;
  :func:`vqgan_training_footprint`), 90 % of it, plus the weights, gradients and AdamW's two moments in float32.
  The count of the reference ops is within 4 % above the storage a CPU run keeps (tiny preset 36.4 against 34.9
  MiB an image; clevr at 64 px 402.5 against 399.2, at 96 px 551.7 against 549.6), hence the 90 %. At 224 px the
  paper's VQGAN keeps 1.8 GiB an image, so its default batch of 16 needs 27 GiB: the first, one-feature-map bound
  said 1.2 GiB, and a CPU run without ``--preset`` was killed at 23 GB;
- encoder: per token, inference holds one layer's residual stream and MLP hidden layer (``enc_dim + enc_mlp``
  values); training keeps, in every layer, the block's input, q, k, v and attention output (5 x ``enc_dim``) and
  the MLP's hidden layer before and after its activation (2 x ``enc_mlp``) for the backward pass.

Activations count 2 bytes each (bf16, the smallest the model computes in), or 4 where a training run computes in
float32 (on a CPU, or without ``--amp``). Apart from the VQGAN's own training, weights, optimizer state, the
decoder, attention scores and the allocator's slack are left out, so a batch below the bound may still not fit;
one above it cannot. The bound is compared with the device's total memory (:func:`device_memory`): a CUDA
device's, or the machine's physical memory (a cgroup limit where one is set, as in a container).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from procap.core import validate
from procap.core.config import ProCapConfig, config_from_dict, get_preset
from procap.core.errors import ProCapError
from procap.core.weights import meta_build
from procap.loading.checkpoint import read_checkpoint_metadata
from procap.train.common import load_pairs
from procap.train.distributed import env_context

logger = logging.getLogger(__name__)

PIXEL_BYTES = 4  # float32 images
ACTIVATION_BYTES = 2  # bf16: the smallest dtype activations are held in
FLOAT32_BYTES = 4
STAGES = ("inference", "vqgan", "pretrain", "train")
# Share of the meta-device count of the VQGAN's saved activations taken as certain: the reference ops it runs keep
# up to 4 % more than the fused kernels of a real run (module docstring).
VQGAN_SAVED_SHARE = 0.9
TRAINING_STATE_BYTES = 4 * FLOAT32_BYTES  # per parameter: weight, gradient, AdamW's two moments

_vqgan_footprints: dict[str, tuple[int, int]] = {}


def vqgan_training_footprint(vq: Any) -> tuple[int, int]:
    """``(bytes, parameters)``: the float32 bytes autograd keeps for one image's backward pass through the VQGAN's
    reconstruction loss, and the VQGAN's parameter count.

    Counted by building the VQGAN and running its loss on the meta device, where tensors have shapes and no
    storage: each tensor saved for the backward pass is counted once. Remembered per configuration.
    """
    import torch

    from procap.model.vqgan import VQGAN

    key = repr(vq)
    if key not in _vqgan_footprints:
        saved: dict[int, torch.Tensor] = {}  # by identity: a tensor saved by two ops is kept once

        def keep(tensor: torch.Tensor) -> torch.Tensor:
            saved[id(tensor)] = tensor
            return tensor

        with meta_build():  # initialisation skipped: the parameters' values are no part of the count
            model = VQGAN(vq).train()
        with torch.device("meta"):
            images = torch.empty(1, vq.in_channels, vq.resolution, vq.resolution)
            with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
                model.reconstruction_loss(images)
        total = sum(t.numel() * t.element_size() for t in saved.values())
        _vqgan_footprints[key] = total, sum(p.numel() for p in model.parameters())
    return _vqgan_footprints[key]


def batch_bytes(config: Any, batch: int, stage: str = "inference", activation_bytes: int = ACTIVATION_BYTES) -> int:
    """Lower bound of the memory one batch of ``batch`` items takes (see the module docstring).

    Args:
        config: a :class:`procap.core.config.ProCapConfig`.
        batch: items per batch (pairs; images for the VQGAN stage).
        stage: ``"inference"`` (caption, evaluate, profile), ``"vqgan"``, ``"pretrain"`` or ``"train"``.
        activation_bytes: bytes of one activation value: 2 (bf16) unless the run computes in float32 (4).
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    vq = config.vqgan
    if stage == "vqgan":  # one image per item, at the tokenizer's resolution, with the VQGAN's training state
        side = vq.resolution
        saved, parameters = vqgan_training_footprint(vq)
        activations = int(saved * VQGAN_SAVED_SHARE * activation_bytes / FLOAT32_BYTES)
        return batch * (3 * side * side * PIXEL_BYTES + activations) + parameters * TRAINING_STATE_BYTES
    side = config.image_size
    images = config.num_frames if stage == "pretrain" else 2  # stage 1 reads k keyframes besides the pair
    tokens = config.memory_tokens
    if stage == "inference":
        encoder = tokens * (config.enc_dim + config.enc_mlp)
    else:
        encoder = config.enc_layers * tokens * (5 * config.enc_dim + 2 * config.enc_mlp)
    per_item = images * (3 * side * side * PIXEL_BYTES + vq.ch * side * side * activation_bytes)
    return batch * (per_item + encoder * activation_bytes)


def device_memory(device: Any = None) -> tuple[int, str] | None:
    """(bytes, description) of the memory a batch on ``device`` can use at most, or None when unknown."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        _, on_device = torch.cuda.mem_get_info(device)
        return on_device, f"the {_gib(on_device)} of {device}"
    total = _physical_memory()
    return (total, f"the {_gib(total)} of memory of this machine") if total else None


def _physical_memory() -> int | None:
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not Linux / macOS
        return None
    try:  # a container's limit (cgroup v2), when lower
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total if total > 0 else None


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes < 2**40 else f"{nbytes / 2**40:,.1f} TiB"


def check_batch(
    config: Any,
    batch: int,
    stage: str,
    device: Any = None,
    flag: str = "--batch-size",
    requested: int | None = None,
    what: str = "items",
    activation_bytes: int = ACTIVATION_BYTES,
) -> None:
    """Raise a one-sentence :class:`ProCapError` naming ``flag`` when a batch surely does not fit on ``device``.

    ``requested``: the flag's value when ``batch`` is that value cut to the ``what`` there are (the message names
    both).
    """
    need = batch_bytes(config, batch, stage, activation_bytes)
    have = device_memory(device)
    if have is not None and need > have[0]:
        size = config.vqgan.resolution if stage == "vqgan" else config.image_size
        given = f"{flag} {batch}" if requested in (None, batch) else f"{flag} {requested} (cut to the {batch} {what})"
        raise ProCapError(
            f"{given} needs at least {_gib(need)} for one batch of {size} px images ({config.name} model), "
            f"more than {have[1]}; lower {flag}."
        )


def clamp_note(flag_value: int, items: int, what: str, command: str, default: int = 32) -> None:
    """Warn (on stderr, from the command line) that a batch above the flag's ``default`` is cut to the ``items`` there
    are."""
    if items < flag_value and flag_value > default:  # the default batch outnumbers a handful of pairs unasked
        logger.warning(
            "procap %s: --batch-size %d is more than the %d %s; using batches of %d",
            command,
            flag_value,
            items,
            what,
            items,
        )


def checkpoint_config(path: str | os.PathLike) -> Any:
    """The :class:`procap.core.config.ProCapConfig` in a checkpoint's header, without reading its weights.

    None when the file or its stored config is unreadable: loading the checkpoint reports that, naming the file
    or the field.
    """
    try:
        return config_from_dict(ProCapConfig, read_checkpoint_metadata(Path(path))["config"])
    except (ValueError, ProCapError):
        return None


def check_checkpoint_batch(
    checkpoint: str | os.PathLike, requested: int, items: int | None, device: Any, what: str, command: str
) -> int:
    """The batch for captioning ``items`` pairs with ``checkpoint``'s model on ``device``: ``requested`` cut to the
    items (a warning when it was cut from above the default), refused when it cannot fit (:func:`check_batch`).
    """
    batch = requested if items is None else min(requested, items)
    config = checkpoint_config(checkpoint)
    if config is not None:
        check_batch(config, batch, "inference", device, requested=requested, what=what)
    clamp_note(requested, batch, what, command)  # after the check: a refusal stays one sentence
    return batch


def check_training_batch(cfg: Any) -> None:
    """:func:`check_batch` for a training run (``procap vqgan``, ``pretrain``, ``train``) before it loads anything.

    The model is the ``--init`` checkpoint's where one is given, else the preset's. A single process cuts a batch
    larger than the training items to the items (:class:`procap.train.datasets.EpochBatchSampler`), so a batch
    that does not fit is checked again at that size, counting the items from the split file, before refusing.
    """
    cfg = cfg.resolved()
    config = checkpoint_config(cfg.init) if cfg.init and cfg.stage != "vqgan" else None
    if config is None:
        overrides = {} if cfg.num_keyframes is None else {"num_keyframes": cfg.num_keyframes}
        try:
            config = get_preset(cfg.preset, **overrides)
        except (KeyError, ValueError):
            return  # building the model names the bad value
    device = validate.device(None if cfg.device == "auto" else cfg.device)
    # autocast to bf16 is CUDA-only: elsewhere, or without --amp, a run holds its activations in float32
    activation_bytes = ACTIVATION_BYTES if device.type == "cuda" and cfg.amp else FLOAT32_BYTES
    try:
        check_batch(config, cfg.batch_size, cfg.stage, device, activation_bytes=activation_bytes)
    except ProCapError:
        if env_context().world > 1 or cfg.grad_accum > 1:
            raise

        pairs = load_pairs(cfg, "train")
        items = len({str(p.before_path) for p in pairs} | {str(p.after_path) for p in pairs})
        items = items if cfg.stage == "vqgan" else len(pairs)
        what = "training images" if cfg.stage == "vqgan" else "training items"
        batch = min(cfg.batch_size, items)
        check_batch(
            config, batch, cfg.stage, device, requested=cfg.batch_size, what=what, activation_bytes=activation_bytes
        )
