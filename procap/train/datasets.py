"""Training datasets: stage-2 image pairs and stage-1 explicit procedures.

Both read :class:`procap.data.ChangePair` records. Images go through :func:`procap.data.load_image` (the one
preprocessing shared with evaluation and ``procap.fast``) and, for small datasets such as the demo's, are kept
in memory after the first decode (:class:`procap.data.images.ImageCache`) so CPU training is not bound by PNG
decoding.

Stage-1 frames come from a *procedure source*: any callable ``(pair, before, after) -> (T, 3, S, S)`` float
tensor in [0, 1] whose first and last frames are ``before`` and ``after``. :class:`CrossFadeProcedures` is the
stand-in (linear cross-fade); :class:`TruthProcedures` renders the exact intermediate states of a synthetic
benchmark (an upper bound for what interpolation can give); the real interpolated, confidence-sampled procedures
of ``procap.procedure`` plug in at the single place :func:`make_procedure_source` builds the source.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from procap.core.errors import ProCapError
from procap.data.images import ImageCache, to_tensor
from procap.data.records import ChangePair
from procap.data.synthetic import render_intermediate
from procap.data.synthetic import scene_of as synthetic_scene_of

if TYPE_CHECKING:
    from procap.data import Vocabulary

ProcedureSource = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


def pick_caption(captions: Sequence[str], seed: int, epoch: int, index: int) -> str:
    """One reference caption per item and epoch, reproducible from (seed, epoch, index) alone.

    Keeping the choice out of the global RNG makes it independent of worker count and of resuming.
    """
    if len(captions) == 1:
        return captions[0]
    rng = np.random.default_rng([seed, epoch, index])
    return captions[int(rng.integers(len(captions)))]


def identical_training_pairs(pairs: Sequence[Any], share: float, seed: int = 0) -> list[ChangePair]:
    """``round(share * len(pairs))`` pairs that show one image of ``pairs`` twice (before = after), each captioned
    with the captions of one of the split's no-change pairs: that the same image twice is no change is then taught,
    not left to the distractors (whose views move). Images and captions are drawn with ``seed``.

    Raises:
        ProCapError: ``share`` > 0 and the split has no no-change pair to take captions from.
    """
    count = round(share * len(pairs))
    if count == 0:
        return []
    no_change = [pair for pair in pairs if pair.change_type == "no_change" and pair.captions]
    if not no_change:
        raise ProCapError(
            "identical_pairs needs no-change pairs among the training pairs to caption them, and these have none; "
            "leave it at 0."
        )
    images = list(dict.fromkeys(path for pair in pairs for path in (pair.before_path, pair.after_path)))
    rng = random.Random(seed)
    chosen = rng.sample(images, count) if count <= len(images) else [rng.choice(images) for _ in range(count)]
    return [
        ChangePair(
            f"identical-{index}:{Path(path).name}", Path(path), Path(path), rng.choice(no_change).captions, "no_change"
        )
        for index, path in enumerate(chosen)
    ]


class EpochDataset(Dataset[dict[str, Any]]):
    """A map-style dataset of dict items whose random draws follow the epoch: what :class:`procap.train.loop.Trainer`
    reads (it sets the epoch before each one's loader)."""

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class PairDataset(EpochDataset):
    """Stage-2 items: ``{"before": (3,S,S), "after": (3,S,S), "caption": (L,) long, "index": int}``.

    Args:
        pairs: the split's change pairs.
        vocab: a :class:`procap.data.Vocabulary`.
        image_size: S.
        max_len: caption length L including BOS/EOS (the model's ``max_caption_len``).
        seed: drives the per-epoch caption choice (:func:`pick_caption`).
        cache: shared :class:`ImageCache`; a fresh caching one is made when ``None``.
    """

    def __init__(
        self,
        pairs: Sequence[Any],
        vocab: Vocabulary,
        image_size: int,
        max_len: int = 24,
        seed: int = 0,
        cache: ImageCache | None = None,
    ) -> None:
        self.pairs, self.vocab, self.max_len, self.seed = list(pairs), vocab, max_len, seed
        self.cache = cache if cache is not None else ImageCache(image_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.pairs)

    def caption_tokens(self, index: int) -> torch.Tensor:
        text = pick_caption(self.pairs[index].captions, self.seed, self.epoch, index)
        return torch.tensor(self.vocab.encode(text, max_len=self.max_len), dtype=torch.long)

    def __getitem__(self, index: int) -> dict[str, Any]:
        pair = self.pairs[index]
        return {
            "before": self.cache(pair.before_path),
            "after": self.cache(pair.after_path),
            "caption": self.caption_tokens(index),
            "index": index,
        }


class CrossFadeProcedures:
    """Stand-in procedure source: ``k`` cross-faded keyframes at evenly spaced t between before and after.

    Frame i (0 <= i <= k + 1) is ``(1 - t_i) * before + t_i * after`` with ``t_i = i / (k + 1)``.
    """

    def __init__(self, num_keyframes: int) -> None:
        self.num_keyframes = num_keyframes

    def __call__(self, pair: Any, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """(3, S, S), (3, S, S) -> (k + 2, 3, S, S)."""
        t = torch.linspace(0.0, 1.0, self.num_keyframes + 2, dtype=before.dtype).view(-1, 1, 1, 1)
        return (1.0 - t) * before.unsqueeze(0) + t * after.unsqueeze(0)


class TruthProcedures:
    """Exact procedure frames of a benchmark written by ``procap synth``: k keyframes at evenly spaced t.

    Keyframe i (1 <= i <= k) is the scene rendered at ``t_i = i / (k + 1)`` of its pair
    (:func:`procap.data.synthetic.render_intermediate`: the object's change and, where the pair has one, the
    view's), read through the preprocessing of training (:func:`procap.data.images.to_tensor`). Frames at t = 0
    and t = 1 equal the before and after images. Rendered frames are kept in memory (uint8), since a scene takes
    milliseconds to draw and stage 1 visits each pair many times.

    Args:
        root: the benchmark's folder (it holds ``scenes.json``).
        num_keyframes: k.

    Raises:
        ProCapError: ``root`` holds no ``scenes.json``.
    """

    def __init__(self, root: str | Path, num_keyframes: int) -> None:
        self.root, self.num_keyframes = Path(root), num_keyframes
        if not (self.root / "scenes.json").is_file():
            raise ProCapError(
                f"--procedures truth renders the frames of a benchmark written by `procap synth`, and {self.root} "
                "holds no scenes.json."
            )
        self._rendered: dict[tuple[str, float], np.ndarray] = {}

    @staticmethod
    def scene_of(pair: Any) -> tuple[int, bool]:
        """(scene index, is the distractor pair) of a synthetic pair, from its after image's file name."""
        name = Path(str(pair.after_path)).name
        found = synthetic_scene_of(name)
        if found is None:
            raise ProCapError(
                f"--procedures truth: pair {pair.id} (after image {name}) is not a pair of a `procap synth` benchmark."
            )
        return found

    def frames_at(self, pair: Any, times: Sequence[float], size: int) -> torch.Tensor:
        """The pair's scene at each of ``times`` (in [0, 1]): (len(times), 3, size, size) float32 in [0, 1]."""
        index, distractor = self.scene_of(pair)
        frames = []
        for t in times:
            key = (str(pair.after_path), float(t))
            if key not in self._rendered:
                self._rendered[key] = render_intermediate(self.root, index, float(t), distractor=distractor)
            frames.append(to_tensor(Image.fromarray(self._rendered[key]), size))
        return torch.stack(frames) if frames else torch.empty(0, 3, size, size)

    def __call__(self, pair: Any, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """(3, S, S), (3, S, S) -> (k + 2, 3, S, S): before, the k rendered keyframes, after."""
        times = [i / (self.num_keyframes + 1) for i in range(1, self.num_keyframes + 1)]
        middle = self.frames_at(pair, times, before.shape[-1]).to(before.dtype)
        return torch.cat([before.unsqueeze(0), middle, after.unsqueeze(0)])


def make_procedure_source(spec: str, num_keyframes: int, root: str | None = None) -> ProcedureSource:
    """Build the stage-1 frame source named by ``--procedures``.

    ``crossfade`` is the built-in stand-in; ``truth`` renders the exact frames of a synthetic benchmark in ``root``
    (:class:`TruthProcedures`). Anything else is a path to a procedure cache written by ``procap prepare``
    (``procap.procedure``); swapping sources is this one function.
    """
    if spec == "crossfade":
        return CrossFadeProcedures(num_keyframes)
    if spec == "truth":
        if root is None:
            raise ProCapError(
                "--procedures truth renders the frames of a synthetic benchmark; pass its folder as --data."
            )
        return TruthProcedures(root, num_keyframes)
    # Imported here: procap.procedure brings h5py (the [train] extra), needed only when a cache is read; without
    # it the CLI names the extra to install.
    from procap.procedure import CachedProcedures

    if not Path(spec).exists():
        raise ProCapError(f"procedure cache {spec} does not exist; build it with `procap prepare`")
    return CachedProcedures(spec, num_keyframes=num_keyframes)


class ProcedureDataset(EpochDataset):
    """Stage-1 items: ``{"frames": (T,3,S,S), "caption": (L,), "index": int}`` (+ ``"codes": (T*n,)`` when given).

    Args:
        pairs, vocab, image_size, max_len, seed, cache: as in :class:`PairDataset`.
        procedure_source: ``(pair, before, after) -> (T, 3, S, S)`` in [0, 1].
        codes: optional precomputed VQ indices, a (len(pairs), T*n) long tensor (MSM targets).
    """

    def __init__(
        self,
        pairs: Sequence[Any],
        vocab: Vocabulary,
        image_size: int,
        procedure_source: ProcedureSource,
        max_len: int = 24,
        seed: int = 0,
        cache: ImageCache | None = None,
        codes: torch.Tensor | None = None,
    ) -> None:
        self.base = PairDataset(pairs, vocab, image_size, max_len, seed, cache)
        self.procedure_source, self.codes = procedure_source, codes
        if codes is not None and codes.shape[0] != len(self.base):
            raise ValueError(f"codes has {codes.shape[0]} rows for {len(self.base)} pairs")

    def set_epoch(self, epoch: int) -> None:
        self.base.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict[str, Any]:
        pair = self.base.pairs[index]
        before, after = self.base.cache(pair.before_path), self.base.cache(pair.after_path)
        frames = self.procedure_source(pair, before, after)
        item = {"frames": frames.float().clamp(0.0, 1.0), "caption": self.base.caption_tokens(index), "index": index}
        if self.codes is not None:
            item["codes"] = self.codes[index]
        return item


class ImageDataset(EpochDataset):
    """Every distinct image of a list of pairs, for VQGAN training: ``{"image": (3, S, S)}``."""

    def __init__(self, pairs: Sequence[Any], image_size: int, cache: ImageCache | None = None) -> None:
        seen: dict[str, None] = {}
        for pair in pairs:
            seen.setdefault(str(pair.before_path))
            seen.setdefault(str(pair.after_path))
        self.paths = list(seen)
        self.cache = cache if cache is not None else ImageCache(image_size)

    def set_epoch(self, epoch: int) -> None:  # no per-epoch randomness
        pass

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": self.cache(self.paths[index])}


class EpochBatchSampler(Sampler[list[int]]):
    """Shuffled, fixed-size batches whose order depends only on (seed, epoch); can start mid-epoch.

    Resuming at step ``b`` of epoch ``e`` replays exactly the batches an uninterrupted run would have seen.
    The last incomplete global batch is dropped so every step has the same shape.

    Data parallelism and gradient accumulation (``DistributedSampler``-style, but keeping the single-process
    order): a step consumes one *global* batch of ``batch_size x num_replicas x accumulation`` items, the
    next slice of the same (seed, epoch) permutation a single process with that batch size would use. Rank
    ``r`` takes the ``r``-th contiguous ``batch_size x accumulation`` block of it and yields it as
    ``accumulation`` micro-batches of ``batch_size``; so the union over ranks and micro-batches of a step is
    the same set of items whatever the split.

    Args:
        num_items: dataset length.
        batch_size: per-process micro-batch size.
        seed: with the epoch, fixes the permutation.
        num_replicas, rank: data-parallel world size and this process's rank.
        accumulation: micro-batches per optimizer step.
    """

    def __init__(
        self,
        num_items: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        accumulation: int = 1,
    ) -> None:
        if num_items <= 0:
            raise ValueError("cannot batch an empty dataset")
        if not 0 <= rank < num_replicas or accumulation < 1 or batch_size < 1:
            raise ValueError(f"bad sharding: rank {rank} of {num_replicas}, accumulation {accumulation}")
        self.parts = num_replicas * accumulation
        if self.parts == 1:
            batch_size = min(batch_size, num_items)  # single process: a batch larger than the data is the data
        elif batch_size * self.parts > num_items:
            raise ValueError(
                f"a global batch of {batch_size} x {num_replicas} processes x {accumulation} accumulation steps "
                f"is larger than the {num_items} training items"
            )
        self.num_items, self.batch_size = num_items, batch_size
        self.rank, self.accumulation = rank, accumulation
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.start_batch = 0, 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.parts

    @property
    def steps_per_epoch(self) -> int:
        return self.num_items // self.global_batch

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Start at optimizer step ``start_batch`` of ``epoch``."""
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        """Micro-batches this rank yields per epoch (``steps_per_epoch x accumulation``)."""
        return self.steps_per_epoch * self.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.num_items, generator=gen).tolist()
        else:
            order = list(range(self.num_items))
        block = self.batch_size * self.accumulation
        for step in range(self.start_batch, self.steps_per_epoch):
            first = step * self.global_batch + self.rank * block
            for micro in range(self.accumulation):
                start = first + micro * self.batch_size
                yield order[start : start + self.batch_size]
