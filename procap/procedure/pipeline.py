"""``procap prepare``: build the procedure cache for a dataset split.

Work split: a pool of worker processes loads and validates each pair and synthesises its l intermediate
frames (optical flow is CPU work in OpenCV); the main process is the single writer that owns the HDF5 files.
It scores the frames (similarity model, GPU if present), computes the VQ codes of every frame, and writes each
pair completely (frames, scores, codes, then the ``complete`` marker) and flushes before the next one, so an
interrupted run (Ctrl-C, SIGTERM, a crash) loses at most the pair in flight and a rerun skips finished pairs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from procap.core.config import FRAME_SIMILARITIES
from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json, sha256_of
from procap.core.validate import parse_shard
from procap.data import load_image, load_split
from procap.data.datasets import score_subkey
from procap.data.images import open_image
from procap.model.vqgan import VQGAN
from procap.procedure import similarity as sim
from procap.procedure.cache import (
    CACHE_FORMAT,
    CACHE_VERSION,
    MANIFEST,
    CacheWriter,
    authors_key,
    read_manifest,
    stored_sources,
)
from procap.procedure.interpolate import FlowInterpolator, Interpolator, generate_procedure, levels_for
from procap.procedure.shards import shard_dir, shard_pairs
from procap.procedure.sources import check_unchanged, record


@dataclass
class PrepareOptions:
    """Everything that decides the content of a cache (stored in its manifest)."""

    dataset: str
    root: str
    out: str
    splits: tuple[str, ...] = ("train",)
    num_generated: int = 7
    image_size: int = 224
    similarity: str = "vqgan"  # vqgan | dinov2 | scores
    scores_file: str | None = None
    dinov2_weights: str | None = None
    vqgan: str | None = None
    workers: int = 1
    allow_size_mismatch: bool = False
    compression: str | None = None
    device: str | None = None
    limit: int | None = None  # only the first N pairs (quick runs)
    direct: bool = True  # all l frames from the endpoints' flow when the interpolator can (else recursive)
    store_codes: bool = True  # VQ codes of every frame (needs --vqgan)
    score_batch: int = 8  # pairs scored per similarity / VQGAN call (written one by one afterwards)
    progress: bool = True
    shard: tuple[int, int] | None = None  # (I, N): only pairs I, I + N, ... into OUT/shards/I-of-N (procedure.shards)

    def content_key(self) -> dict[str, Any]:
        """The fields a resumed run must share with the run that started the cache.

        Model and score files are recorded by content (sha256) as well as by name: a VQGAN retrained under the
        same file name would otherwise mix two tokenizers' codes in one cache. Where both runs recorded the content,
        it decides and the name is only a record (:func:`_content_decides`).
        """
        key: dict[str, Any] = {
            "dataset": self.dataset,
            "num_frames": self.num_generated,  # the manifest key caches were written with
            "image_size": self.image_size,
            "similarity": self.similarity,
            "direct": self.direct,
        }
        for name in CONTENT_FILES:
            path = getattr(self, name)
            key[name] = Path(path).name if path else None
            key[f"{name}_sha256"] = sha256_of(path) if path else None
        return key


CONTENT_FILES = ("vqgan", "scores_file", "dinov2_weights")  # the input files whose content decides a cache's


# ------------------------------------------------------------------------------------------- image loading


def read_pair(pair: Any, size: int, allow_size_mismatch: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Load and validate a pair: ((3, S, S), (3, S, S)) float in [0, 1].

    Raises:
        ProCapError: an image is missing or unreadable (naming the file), or before and after differ in
            size (naming the pair) unless ``allow_size_mismatch``.
    """
    sizes = []
    for path in (pair.before_path, pair.after_path):
        with open_image(path) as img:  # missing, too large or not an image: one sentence naming the file
            try:
                img.verify()
            except (OSError, SyntaxError, ValueError) as exc:
                raise ProCapError(f"image {path} cannot be read ({exc}).") from None
            sizes.append(img.size)
    if sizes[0] != sizes[1] and not allow_size_mismatch:
        raise ProCapError(
            f"pair {pair.id}: before {pair.before_path} is {sizes[0][0]}x{sizes[0][1]} but after "
            f"{pair.after_path} is {sizes[1][0]}x{sizes[1][1]} (use --allow-size-mismatch to resize both)."
        )
    return _load(pair.before_path, size), _load(pair.after_path, size)


def _load(path: Path, size: int) -> torch.Tensor:
    return load_image(path, size)  # the one preprocessing shared with training and evaluation


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """float [0, 1] tensor -> uint8 numpy (rounded)."""
    return (frames.detach().float().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).cpu().numpy()


# ------------------------------------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}


class Synthesized(NamedTuple):
    """A pair's procedure, made in a worker: what the cache stores besides its scores and codes."""

    pair_index: int  # the pair's place in the job list
    frames: np.ndarray  # uint8 (l + 2, 3, S, S): before, the l generated frames, after
    source: str  # the fingerprints of its two images (procap.procedure.sources.record)


class Refused(NamedTuple):
    """A pair a worker could not read (missing, unreadable or mismatched images)."""

    pair_index: int
    error: str  # one sentence naming the file or the pair


def _init_worker(interpolator: Interpolator, num_generated: int, size: int, allow_mismatch: bool, direct: bool) -> None:
    # One thread per worker: the pool already uses every core, and oversubscription slows torch and OpenCV.
    import cv2

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates the pool
    _init_worker_inline(interpolator, num_generated, size, allow_mismatch, direct)


def _synthesize(job: tuple[int, Any]) -> Synthesized | Refused:
    """(index, pair) -> its frames, or why it was refused.

    The source record (:func:`procap.procedure.sources.record`) fingerprints the two images read, here in the
    worker, where hashing them runs in parallel with the other pairs.
    """
    index, pair = job
    threads = torch.get_num_threads()
    # Frames are small: torch's intra-op threads only fight the other workers (10x slower on 2 busy cores).
    torch.set_num_threads(1)
    try:
        before, after = read_pair(pair, _WORKER["size"], _WORKER["allow_mismatch"])
        mids = generate_procedure(before, after, _WORKER["interpolator"], _WORKER["num_generated"], _WORKER["direct"])
        frames = torch.cat([before[None], mids, after[None]], dim=0)
        return Synthesized(index, to_uint8(frames), record(pair))
    except ProCapError as exc:
        return Refused(index, str(exc))
    finally:
        torch.set_num_threads(threads)


def synthesized(
    jobs: Sequence[tuple[int, Any]],
    interpolator: Interpolator,
    num_generated: int,
    size: int,
    allow_mismatch: bool,
    workers: int,
    direct: bool = True,
) -> Iterator[Synthesized | Refused]:
    """Yield ``_synthesize`` results, in a process pool when ``workers > 1``."""
    init = (interpolator, num_generated, size, allow_mismatch, direct)
    if workers <= 1:
        _init_worker_inline(*init)
        yield from map(_synthesize, jobs)
        return
    import multiprocessing as mp

    # spawn, not fork: a child forked after the parent used torch's OpenMP pool can deadlock in it.
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=init)
    finished = False
    try:
        yield from pool.imap(_synthesize, jobs, chunksize=4)
        # The workers exit on their own once every pair is done: terminating them skipped their clean-up, which
        # `procap demo` reported at exit as leaked semaphores.
        pool.close()
        pool.join()
        finished = True
    finally:
        if not finished:  # an error, Ctrl-C or a consumer that stopped early: stop the workers now
            pool.terminate()
            pool.join()


def _init_worker_inline(
    interpolator: Interpolator, num_generated: int, size: int, allow_mismatch: bool, direct: bool
) -> None:
    _WORKER.update(
        interpolator=interpolator,
        num_generated=num_generated,
        size=size,
        allow_mismatch=allow_mismatch,
        direct=direct and hasattr(interpolator, "frames_at"),
    )


# ------------------------------------------------------------------------------------------- writer side


def load_vqgan(path: str, device: torch.device) -> VQGAN:
    """A frozen VQGAN from ``procap vqgan`` output (.safetensors) or a taming checkpoint (.ckpt)."""
    return VQGAN.load(path).requires_grad_(False).to(device)


def build_similarity(opts: PrepareOptions, vqgan: VQGAN | None, device: torch.device) -> Any:
    if opts.similarity == "vqgan":
        if vqgan is None:
            raise ProCapError("--similarity vqgan needs --vqgan CKPT (the frozen VQGAN the model uses).")
        return sim.VQGANSimilarity(vqgan, device)
    if opts.similarity == "dinov2":
        if not opts.dinov2_weights:
            raise ProCapError("--similarity dinov2 needs --dinov2-weights FILE (nothing is downloaded).")
        return sim.DINOv2Similarity(opts.dinov2_weights, device=device)
    if opts.similarity == "scores":
        if not opts.scores_file:
            raise ProCapError("--similarity scores needs --scores-file FILE (the authors' similarity JSON).")
        return sim.ScoreFileSimilarity(opts.scores_file)
    raise ProCapError(f"--similarity must be one of {', '.join(FRAME_SIMILARITIES)}, got {opts.similarity!r}.")


@torch.no_grad()
def _score_and_code(
    batch: list[np.ndarray],
    keys: list[tuple[str | None, str]],
    similarity: Any,
    vqgan: VQGAN | None,
    device: torch.device,
) -> list[tuple[np.ndarray, np.ndarray, Any]]:
    """Similarities and codes for a batch of procedures (one model call for all their frames).

    Batching matters on CPU: per-call overhead (and thread synchronisation on busy cores) dominates for
    9 small frames, and one call over 8 pairs is several times faster than 8 calls.
    """
    frames = torch.from_numpy(np.stack(batch)).to(device).float().div_(255.0)  # (P, T, 3, S, S)
    p, t = frames.shape[:2]
    if hasattr(similarity, "embed"):
        s_bef, s_aft = similarity(frames)
    else:  # look-up similarities (score files): one key at a time
        pairs = [similarity(f, key) for f, key in zip(frames, keys)]
        s_bef, s_aft = torch.stack([x[0] for x in pairs]), torch.stack([x[1] for x in pairs])
    codes = vqgan.codes(frames.flatten(0, 1)).view(p, t, -1).cpu().numpy() if vqgan is not None else [None] * p
    s_bef, s_aft = s_bef.float().cpu().numpy(), s_aft.float().cpu().numpy()
    return [(s_bef[i], s_aft[i], codes[i]) for i in range(p)]


def _content_decides(key: str, existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``key`` is the file name of a content file whose content both runs recorded: then its sha256 entry
    decides, and the same file under another name (copied, renamed, another folder's copy) resumes the cache."""
    digest = f"{key}_sha256"
    return key in CONTENT_FILES and existing.get(digest) is not None and wanted.get(digest) is not None


def _check_manifest(opts: PrepareOptions) -> None:
    """Create the manifest, or check that a resumed run uses the same settings."""
    out = Path(opts.out)
    existing = read_manifest(out)
    wanted = opts.content_key()
    if existing is None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            out / MANIFEST, {"format": CACHE_FORMAT, "version": CACHE_VERSION, **wanted, "splits": list(opts.splits)}
        )
        return
    if existing.get("format") != CACHE_FORMAT:
        raise ProCapError(f"{out / MANIFEST} is not a procap procedure-cache manifest.")
    changed = [k for k, v in wanted.items() if existing.get(k) != v and not _content_decides(k, existing, wanted)]
    if changed:
        k = changed[0]
        if k.endswith("_sha256"):
            flag = "--" + k.removesuffix("_sha256").replace("_", "-")
            built = "no record of its content" if existing.get(k) is None else f"sha256 {existing[k][:12]}..."
            raise ProCapError(
                f"cache {out} was built with a {flag} file of other content ({built}; {getattr(opts, k[:-7])} "
                f"has sha256 {wanted[k][:12]}...); rerun with the same file or choose a new --out."
            )
        raise ProCapError(
            f"cache {out} was built with {k}={existing.get(k)!r}, not {wanted[k]!r}; "
            f"rerun with the same settings or choose a new --out."
        )
    splits = sorted(set(existing.get("splits", [])) | set(opts.splits))
    atomic_write_json(out / MANIFEST, {**existing, "splits": splits})


class _Terminate(Exception):
    """Raised by the SIGTERM handler so that SIGTERM unwinds like Ctrl-C."""


def prepare(
    opts: PrepareOptions, pairs: Sequence[Any] | None = None, interpolator: Interpolator | None = None
) -> dict[str, int]:
    """Build (or resume) the cache described by ``opts``.

    Args:
        opts: the options (see ``procap prepare --help``).
        pairs: the pairs to process (default: ``load_split(opts.dataset, opts.root, split)`` per split).
        interpolator: default :class:`FlowInterpolator` (must pickle for ``workers > 1``).

    With ``opts.shard = (I, N)`` only every N-th pair from pair I is processed, into ``OUT/shards/I-of-N``;
    :func:`procap.procedure.shards.merge_shards` joins the shards (``procap prepare --merge``).

    Returns:
        ``{"written": n, "skipped": n, "total": n}``.
    """
    levels_for(opts.num_generated)  # ValueError early for bad l
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    opts, pairs = _selected_pairs(opts, pairs)
    vqgan = load_vqgan(opts.vqgan, device) if opts.vqgan else None
    similarity = build_similarity(opts, vqgan, device)
    keyed = [(authors_key(p.id, opts.dataset), p) for p in pairs]
    _check_scores_cover(opts, similarity, keyed)
    _check_sources(opts, keyed)
    _check_manifest(opts)
    writer = CacheWriter(opts.out, opts.compression)
    groups = sorted({g for (g, _), _ in keyed})
    try:
        done = writer.completed(groups)
        todo = [(i, p) for i, ((g, k), p) in enumerate(keyed) if (g, k) not in done]
        written = _run(opts, keyed, todo, interpolator or FlowInterpolator(), similarity, vqgan, device, writer)
        if opts.similarity != "scores":
            writer.export_scores(groups)
    finally:
        writer.close()
    return {"written": written, "skipped": len(pairs) - len(todo), "total": len(pairs)}


def _selected_pairs(opts: PrepareOptions, pairs: Sequence[Any] | None) -> tuple[PrepareOptions, list[Any]]:
    """The pairs this run prepares (the first ``limit``, then this ``shard``'s share), and its options: a shard
    writes into its own folder."""
    selected = list(pairs) if pairs is not None else prepare_pairs(opts)
    if opts.limit is not None:
        selected = selected[: opts.limit]
    if opts.shard is not None:
        selected = shard_pairs(selected, *opts.shard)
        opts = dataclasses.replace(opts, out=str(shard_dir(opts.out, *opts.shard)), shard=None)
    return opts, selected


def _run(opts, keyed, todo, interpolator, similarity, vqgan, device, writer) -> int:
    from tqdm import tqdm

    bar = tqdm(total=len(keyed), initial=len(keyed) - len(todo), desc="prepare", unit="pair", disable=not opts.progress)
    coder = vqgan if opts.store_codes else None
    batch = _ScoredBatch(keyed, similarity, coder, device, writer, bar.update)
    written = 0
    with _sigterm_raises() as main_thread:
        try:
            for result in synthesized(
                todo,
                interpolator,
                opts.num_generated,
                opts.image_size,
                opts.allow_size_mismatch,
                opts.workers,
                opts.direct,
            ):
                if isinstance(result, Refused):
                    written += batch.flush()  # keep the finished work, then report the bad input
                    raise ProCapError(result.error)
                batch.pending.append(result)
                if len(batch.pending) >= opts.score_batch:
                    written += batch.flush()
            written += batch.flush()
        except (KeyboardInterrupt, _Terminate):
            if main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the final writes short
            batch.flush()  # score and keep what is already synthesized (at most score_batch pairs)
            raise KeyboardInterrupt from None
        finally:
            bar.close()
    return written


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[bool]:
    """SIGTERM raises :class:`_Terminate` inside the block, then the previous handler is back; yields whether this
    is the main thread (signal handlers live there only: elsewhere nothing changes)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise _Terminate()

    if main_thread:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield main_thread
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


class _ScoredBatch:
    """Synthesised pairs waiting to be scored and coded in one model call, then written to the cache."""

    def __init__(
        self,
        keyed: list[tuple[tuple[str, str], Any]],
        similarity: Any,
        coder: VQGAN | None,
        device: torch.device,
        writer: CacheWriter,
        written: Callable[[int], object],
    ) -> None:
        self.keyed, self.similarity, self.coder, self.device = keyed, similarity, coder, device
        self.writer, self.written = writer, written
        self.pending: list[Synthesized] = []

    def flush(self) -> int:
        """Score, code and write every pending pair (each complete and flushed); returns how many."""
        if not self.pending:
            return 0
        keys = [_score_key(self.keyed[item.pair_index][0]) for item in self.pending]
        frames = [item.frames for item in self.pending]
        results = _score_and_code(frames, keys, self.similarity, self.coder, self.device)
        for item, (s_bef, s_aft, codes) in zip(self.pending, results):
            (group, key), pair = self.keyed[item.pair_index]
            self.writer.write(group, key, item.frames, s_bef, s_aft, codes, pair_id=pair.id, source=item.source)
            self.written(1)
        count = len(self.pending)
        self.pending.clear()
        return count


def _score_key(group_key: tuple[str, str]) -> tuple[str | None, str]:
    """(file stem, key) -> the score-file key: CLEVR groups look under sc_/nsc_sim_matrixes."""
    group, key = group_key
    return score_subkey(group), key


def prepare_pairs(opts: PrepareOptions) -> list[Any]:
    """The pairs of every split in ``opts.splits``: the input of ``procap prepare``; none found is an error."""
    pairs = []
    for split in opts.splits:
        pairs += load_split(opts.dataset, opts.root, split)
    if not pairs:
        raise ProCapError(f"no pairs found for {opts.dataset} in {opts.root} (splits: {', '.join(opts.splits)}).")
    return pairs


def _check_sources(opts: PrepareOptions, keyed: list) -> None:
    """A finished pair is kept only if its images are the ones it was built from (checked before any write)."""
    stored = stored_sources(opts.out, sorted({g for (g, _), _ in keyed}))
    for group_key, pair in keyed:
        if group_key in stored:
            check_unchanged(pair, stored[group_key], opts.out)


def _check_scores_cover(opts: PrepareOptions, similarity: Any, keyed: list) -> None:
    """With a score file, every pair must have an entry (checked before any work starts)."""
    if opts.similarity != "scores":
        return
    for (group, key), pair in keyed:
        if key not in similarity:
            raise ProCapError(f"score file {opts.scores_file} has no entry for pair {pair.id} (key {key!r}).")


def options_from_args(args: Any) -> PrepareOptions:
    """Map ``procap prepare`` arguments onto :class:`PrepareOptions`."""
    names = {f.name for f in dataclasses.fields(PrepareOptions)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    values["splits"] = tuple(args.split or ["train"])
    values["num_generated"] = args.frames
    values["image_size"] = args.size
    values.pop("shard", None)
    if getattr(args, "shard", None):
        values["shard"] = parse_shard(args.shard)
    return PrepareOptions(**values)
