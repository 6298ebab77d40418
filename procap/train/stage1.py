"""Stage 1, explicit procedure modeling: masked sequence modeling + align + consistency (L_PRO).

``pretrain(cfg)`` trains the procedure encoder on (before, k keyframes, after) sequences built by the
procedure source named by ``cfg.procedures`` (:func:`procap.train.datasets.make_procedure_source`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from procap.convert.clip import clip_config_overrides, init_encoder_from_clip, load_clip_blocks, parse_init_encoder
from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.core.extras import require_all
from procap.core.weights import load_weights, read_tensors, restore_aliases
from procap.data.images import ImageCache
from procap.kernels.masking import MaskParams, mask_from_params
from procap.loading.checkpoint import load_checkpoint, read_checkpoint_metadata, save_checkpoint
from procap.model.procap import without_procedure_queries
from procap.train import distributed
from procap.train.common import build_vocab, load_pairs, new_model, with_domain
from procap.train.config import TrainConfig
from procap.train.datasets import ProcedureDataset, make_procedure_source
from procap.train.loop import LoadFn, LossFn, Trainer, WeightFn
from procap.train.schedules import stage1_optimizer

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.procap import ProCap

_MASK_STREAM = 1  # separates the mask draws from other per-item streams keyed by (seed, epoch, index)


def model_and_vocab(cfg: TrainConfig, pairs: Sequence[Any], vocab: Vocabulary | None) -> tuple[ProCap, Vocabulary]:
    """The model and vocabulary a stage starts from: ``--init``'s checkpoint, or a new model (its encoder from CLIP
    with ``--init-encoder``) over ``vocab`` or the vocabulary of ``pairs``."""
    if cfg.init and cfg.init_encoder:
        raise ProCapError("--init continues an existing model and --init-encoder starts a new one; pass only one")
    if cfg.init:
        model, vocab, _ = load_checkpoint(cfg.init)
        if cfg.num_keyframes is not None and cfg.num_keyframes != model.config.num_keyframes:
            if cfg.stage == "train" and cfg.num_keyframes == 0:
                # stage 1's encoder captioning without procedure queries (the 2 x 2 ablation's missing cell)
                return without_procedure_queries(model), vocab
            raise ProCapError(
                f"--num-keyframes {cfg.num_keyframes} differs from the {model.config.num_keyframes} of {cfg.init}; "
                "only stage 2 may start from it with 0 (its procedure queries dropped)"
            )
        return model, vocab
    vocab = vocab if vocab is not None else build_vocab(pairs, cfg.dataset)
    overrides = {} if cfg.num_keyframes is None else {"num_keyframes": cfg.num_keyframes}
    if not cfg.init_encoder:
        return new_model(cfg.preset, vocab, cfg.vqgan, **overrides), vocab

    clip = load_clip_blocks(parse_init_encoder(cfg.init_encoder))
    try:
        preset = get_preset(cfg.preset, **overrides)
    except KeyError as exc:
        raise ProCapError(exc.args[0]) from None
    model = new_model(cfg.preset, vocab, cfg.vqgan, **overrides, **clip_config_overrides(clip, preset))
    init_encoder_from_clip(model, clip)
    return model, vocab


def placed_model(
    cfg: TrainConfig, pairs: Sequence[Any], vocab: Vocabulary | None
) -> tuple[ProCap, Vocabulary, distributed.DistContext]:
    """:func:`model_and_vocab` with its tokenizer frozen, on this rank's device once the process group is joined."""
    model, vocab = model_and_vocab(cfg, pairs, vocab)
    model.vqgan.requires_grad_(False)
    ctx, device = distributed.setup(cfg.torch_device(), cfg.dist_timeout)
    model.to(device)
    return model, vocab, ctx


def item_masks(model: ProCap, indices: torch.Tensor, seed: int, epoch: int, device: torch.device) -> MaskParams:
    """Stage-1 masks drawn per training item from (seed, epoch, item index), not per batch.

    A sample's mask then does not depend on which batch, rank or micro-batch it lands in: a data-parallel or
    gradient-accumulated run masks exactly what one process with the global batch masks, and resuming needs no
    RNG state for it. The draws are tiny and made on the CPU, then copied to ``device``.

    Args:
        indices: (B,) dataset indices of the batch's items.

    Returns:
        :class:`MaskParams` for the B items, on ``device``.
    """
    draws = []
    for index in indices.tolist():
        key = np.random.SeedSequence([seed, epoch, int(index), _MASK_STREAM]).generate_state(2, np.uint64)
        generator = torch.Generator().manual_seed(int(key[0] >> np.uint64(1)))
        draws.append(model.sample_mask_params(1, "cpu", generator))
    fields = ("scheme", "patch_prob", "uniform", "block")
    return MaskParams(*(torch.cat([getattr(d, f) for d in draws]).to(device, non_blocking=True) for f in fields))


def weight_loader(model: ProCap) -> LoadFn:
    """``--resume`` loader: the checkpoint's tensors into the live model (same config by construction)."""

    def load(path: Path) -> None:
        tensors, _ = read_tensors(path)
        load_weights(model, restore_aliases(tensors, read_checkpoint_metadata(path).get("aliases", {})), path)

    return load


def _procedure_dataset(
    cfg: TrainConfig, pairs: list[Any], vocab: Vocabulary, model: ProCap, cache: ImageCache | None
) -> ProcedureDataset:
    """Stage 1's items: each pair's (before, k keyframes, after) from ``cfg.procedures``."""
    config = model.config
    source = make_procedure_source(cfg.procedures, config.num_keyframes, cfg.data)
    if hasattr(source, "check_pairs"):  # a procedure cache: every training pair is there and well typed
        source.check_pairs(pairs)
    cache = cache if cache is not None else ImageCache(config.image_size, cfg.cache_images)
    return ProcedureDataset(pairs, vocab, config.image_size, source, config.max_caption_len, cfg.seed, cache)


def _stage1_losses(
    cfg: TrainConfig, model: ProCap, dataset: ProcedureDataset, per_item: bool
) -> tuple[LossFn, WeightFn | None]:
    """Stage 1's loss of a batch and, with masks drawn per item, what weighs a micro-batch (its masked positions)."""
    config = model.config

    def loss_fn(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        if cfg.cache_features:
            model.vqgan.remember(batch["frames"].flatten(0, 1))
        masks = None  # drawn per batch from the global RNG inside stage1_loss
        if per_item:
            masks = item_masks(model, batch["index"], cfg.seed, dataset.base.epoch, batch["frames"].device)
        return model.stage1_loss(batch["frames"], batch["caption"], batch.get("codes"), mask_params=masks)

    def masked_positions(batch: dict[str, Any]) -> torch.Tensor:
        """MSM averages over masked positions: micro-batches and ranks are weighted by their count (Trainer)."""
        masks = item_masks(model, batch["index"], cfg.seed, dataset.base.epoch, torch.device("cpu"))
        return mask_from_params(masks, config.num_frames, config.grid_size, config.grid_size).sum()

    return loss_fn, masked_positions if per_item else None


def pretrain(
    cfg: TrainConfig,
    pairs: Sequence[Any] | None = None,
    vocab: Vocabulary | None = None,
    cache: ImageCache | None = None,
) -> Path:
    """Run stage 1 and return the final checkpoint ``<out>/stage1.safetensors``.

    Args:
        cfg: training options (``stage="pretrain"``); hyper-parameters left ``None`` take the paper's values.
        pairs: training pairs (default: the ``train`` split of ``cfg.data``).
        vocab: vocabulary to use (default: built from the training captions).
        cache: shared in-memory image cache.
    """
    cfg = distributed.resume_after_restart(cfg.resolved())
    require_all(cfg.optional_packages(), "procap pretrain")  # before any work, not at the first use
    torch.manual_seed(cfg.seed)
    pairs = list(pairs) if pairs is not None else load_pairs(cfg, "train")
    model, vocab, ctx = placed_model(cfg, pairs, vocab)
    facts = with_domain(cfg, pairs, model)
    dataset = _procedure_dataset(cfg, pairs, vocab, model, cache)
    if cfg.cache_features:
        model.vqgan.memoize()
    per_item = cfg.item_masks if cfg.item_masks is not None else ctx.world * cfg.grad_accum > 1
    loss_fn, masked_positions = _stage1_losses(cfg, model, dataset, per_item)
    trainer = Trainer(
        cfg,
        model,
        dataset,
        loss_fn,
        lambda total: stage1_optimizer(model, cfg, total),
        save_weights=lambda path, extra: save_checkpoint(path, model, vocab, facts(extra)),
        load_weights=weight_loader(model),
        name="stage1",
        weight_fn=masked_positions,
    )

    def save_final(folder: Path) -> None:
        final = {"stage": "stage1", "step": trainer.state.step, "procedures": cfg.procedures}
        save_checkpoint(folder / "stage1.safetensors", model, vocab, facts(final))

    trainer.fit(finish=save_final)  # the final checkpoint is written before the run is marked finished
    distributed.barrier(ctx)
    return Path(cfg.out) / "stage1.safetensors"
