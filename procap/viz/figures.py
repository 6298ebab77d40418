"""See the procedure a ProCap encoder imagines between two images (the paper's qualitative figures).

:func:`imagine` runs the procedure encoder on the stage-2 input ``{e_bef, e_m x k*n, e_aft}`` (the model's own
input path: :meth:`ProCap.procedure_tokens`, so the optional difference embedding is included), reads the MSM head
at the k*n procedure-query positions, takes the most likely VQ code per position (or samples one), and decodes
the codes with the frozen VQGAN into k frames. :func:`render_strip` lays out before | imagined frames | after with
the generated caption underneath.

:func:`explicit_procedure` shows the other, explicit procedure of a training pair (stage-1 data): all l interpolated
frames between before and after, each frame's confidence score as a bar underneath, and the k keyframes that
:func:`procap.procedure.sample_keyframes` draws from those scores outlined in colour (:func:`render_procedure_strip`).
:func:`procedure_from_cache` reads the frames and similarities a ``procap prepare`` cache stored;
:func:`procedure_from_pair` synthesizes them now with an interpolator and a similarity model.

Which head is read matters. The MSM head is trained only in stage 1, where the encoder sees the caption too:

- a **stage-1** checkpoint gives the paper's picture: the stage-1 encoder and its trained head (here without the
  caption, as at inference);
- a **stage-2** checkpoint's encoder was fine-tuned for captioning while its MSM head stayed as stage 1 left it,
  so the frames show what the stage-1 head reads from the fine-tuned encoder; a stage-2 model trained without
  stage 1 has an untrained head, and its frames are noise;
- with a caption (``condition``), the encoder gets stage 1's sequence ``{e_align, e_T, e_csy, frames}`` with the
  keyframes fully masked: the reconstruction conditioned on the caption, as the head was trained;
- the static-pair baseline (k = 0) has no procedure queries and the ``authors`` variant has no MSM head: both
  raise :class:`ProCapError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image, ImageDraw, ImageFont

from procap.core.errors import ProCapError
from procap.fast.inputs import check_pixels, to_image_tensor
from procap.model.departures import depth_to_space

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.procap import ProCap

MIN_TILE = 128  # small images (the tiny preset's 64 px) are enlarged so that the strip is readable
GAP = 4  # pixels between tiles and around the strip
FONT_SIZE = 14
BACKGROUND = (255, 255, 255)
TEXT = (0, 0, 0)
BAR_HEIGHT = 8  # confidence bar under each interpolated frame
BAR_COLOUR = (40, 110, 220)
BAR_TRACK = (225, 225, 225)  # the bar's empty part: the full width is a score of 1
KEY_COLOUR = (230, 60, 30)  # outline of the sampled keyframes
KEY_BORDER = 3  # pixels, drawn in the gap around a tile (GAP must be larger)
# What ImageFont.load_default gives: a scalable font where Pillow has FreeType, else the bitmap one.
Font = ImageFont.FreeTypeFont | ImageFont.ImageFont

HEAD_NOTES = {
    "stage1": "stage-1 encoder with its trained MSM head (the paper's figures)",
    "stage2": (
        "stage-2 encoder (fine-tuned for captioning) with the MSM head as stage 1 left it: stage 2 does not train "
        "the head, so the frames show what that head reads from the fine-tuned encoder (noise if the model skipped "
        "stage 1)"
    ),
}


@dataclass
class ImaginedProcedure:
    """What :func:`imagine` returns for one pair.

    Attributes:
        codes: (k, n) int64 VQ code per procedure-query position, row-major over the latent grid.
        probabilities: (k, n) float32 probability the MSM head gave each chosen code.
        frames: (k, 3, S, S) float32 decoded frames in [0, 1] (clamped).
        before, after: (3, S, S) float32 inputs in [0, 1] on the CPU.
        caption: the text under the strip: the generated caption, the ``condition`` caption, a note for a
            stage-1 checkpoint (its decoder is untrained), or '' without a vocabulary.
        head: which encoder and MSM head produced the codes (see the module docstring).
        strip: the PIL image before | imagined frames | after with the caption underneath.
    """

    codes: torch.Tensor
    probabilities: torch.Tensor
    frames: torch.Tensor
    before: torch.Tensor
    after: torch.Tensor
    caption: str
    head: str
    strip: Image.Image


def head_note(stage: str | None) -> str:
    """One line saying which encoder and MSM head a checkpoint of ``stage`` (``stage1``/``stage2``/None) offers."""
    return HEAD_NOTES.get(stage or "", "encoder and MSM head of a checkpoint whose training stage is not recorded")


def check_imaginable(model: ProCap) -> None:
    """Raise :class:`ProCapError` (one sentence) when ``model`` cannot imagine a procedure."""
    config = model.config
    if config.authors.enabled:
        raise ProCapError(
            "this is an authors-variant checkpoint (converted, stage 2 only): it has no MSM head, so it cannot "
            "imagine a procedure."
        )
    if config.num_keyframes == 0:
        raise ProCapError(
            "this checkpoint is a static-pair baseline (k=0): it has no procedure queries and its MSM head was "
            "never trained, so there is no procedure to imagine."
        )


@torch.no_grad()
def procedure_logits(
    model: ProCap, before: torch.Tensor, after: torch.Tensor, caption_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """MSM logits at the procedure-query positions.

    Args:
        model: a :class:`procap.model.procap.ProCap` (``procap`` variant, k >= 1), in eval mode.
        before, after: (B, 3, S, S) in [0, 1] on the model's device.
        caption_ids: optional (B, L) caption ids; the encoder then sees the stage-1 sequence
            ``{e_align, e_T, e_csy, frames}``, i.e. it reconstructs the procedure conditioned on the caption as in
            stage-1 training (the keyframes fully masked). Without it: the stage-2 input, no caption.

    Returns:
        (B, k, h*w, n_embed) float32 logits, frame-major, positions row-major over the latent grid (h*w = n
        without ``token_merge``).
    """
    config = model.config
    n, k = config.tokens_per_frame, config.num_keyframes
    tokens = model.procedure_tokens(before, after)  # (B, (k+2)*n, D): queries are e_m, as fully masked frames
    offset = 0
    if caption_ids is not None:
        tokens = model.stage1_sequence(model.encoder.embed_caption(caption_ids), tokens)
        offset = caption_ids.shape[1] + 2
    out = model.encoder(tokens)
    logits = model.encoder.msm_head(out[:, offset + n : offset + (k + 1) * n])  # (B, k*n, m*m*n_embed)
    # each token predicts its m x m latent cells: put them back on the latent grid, row-major
    b = before.shape[0]
    grid = depth_to_space(logits.float().reshape(b * k, n, -1), config.departures.token_merge)  # (B*k, n_embed, h, w)
    return grid.flatten(2).transpose(1, 2).reshape(b, k, grid.shape[2] * grid.shape[3], -1)


def choose_codes(
    logits: torch.Tensor, sample: bool = False, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one code per position: argmax, or a draw from the softmax with ``generator``.

    Args:
        logits: (..., n_embed).
        sample: draw instead of taking the most likely code.
        generator: RNG for the draw (on ``logits``' device); ignored without ``sample``.

    Returns:
        ``(codes (...) int64, probabilities (...) float32 of the chosen codes)``.
    """
    probs = logits.float().softmax(dim=-1)
    if sample:
        flat = probs.reshape(-1, probs.shape[-1])
        codes = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
    else:
        codes = probs.argmax(dim=-1)
    return codes, probs.gather(-1, codes.unsqueeze(-1)).squeeze(-1)


def _as_batch(image: Any, size: int, name: str) -> torch.Tensor:
    """One image -> (1, 3, S, S) float in [0, 1].

    A float tensor must be (3, S, S) or (1, 3, S, S) in [0, 1]; anything else the Captioner takes (a path, a PIL
    image, a numpy array, a uint8 tensor) is loaded and resized as training does (:mod:`procap.fast.inputs`).
    """
    if not isinstance(image, torch.Tensor) or image.dtype == torch.uint8:
        if isinstance(image, torch.Tensor) and image.dim() == 4 and image.shape[0] == 1:
            image = image[0]
        return to_image_tensor(image, size)[None]
    if image.dim() == 3:
        image = image.unsqueeze(0)
    if image.dim() != 4 or image.shape[0] != 1 or tuple(image.shape[1:]) != (3, size, size):
        raise ProCapError(f"{name} must be one image of shape (3, {size}, {size}), got {tuple(image.shape)}.")
    check_pixels(image, f"{name} pixels")  # NaN or 0-255 floats would imagine garbage without an error
    return image.float()


@torch.no_grad()
def imagine(
    model: ProCap,
    before: torch.Tensor,
    after: torch.Tensor,
    sample: bool = False,
    generator: torch.Generator | None = None,
    vocab: Vocabulary | None = None,
    stage: str | None = None,
    tile: int | None = None,
    condition: str | None = None,
) -> ImaginedProcedure:
    """Imagine the k procedure frames between ``before`` and ``after`` and render them as a strip.

    Args:
        model: a :class:`procap.model.procap.ProCap` (``procap`` variant, k >= 1); run in eval mode, mode restored.
        before, after: (3, S, S) or (1, 3, S, S) float images in [0, 1] (any device; moved to the model's), or
            image files, PIL images, numpy arrays, uint8 tensors (loaded and resized as in training).
        sample: draw each code from the MSM head's softmax instead of taking the most likely one.
        generator: RNG for ``sample`` on the model's device (seed it for a reproducible draw).
        vocab: the checkpoint's vocabulary, to write the generated caption under the strip (None: no caption).
        stage: the checkpoint's training stage (``stage1``/``stage2``, from its metadata) for :attr:`head`.
        tile: side of each image in the strip (default: S, at least :data:`MIN_TILE`).
        condition: optional caption text (needs ``vocab``) to condition the encoder on, as in stage 1 (see
            :func:`procedure_logits`); the strip then shows it instead of a generated caption.

    Returns:
        An :class:`ImaginedProcedure` (codes, probabilities, frames, caption, strip).

    Raises:
        ProCapError: the model has no MSM head or no procedure queries, or an image has the wrong shape.
    """
    check_imaginable(model)
    before, after = _model_inputs(model, before, after)
    codes, probs, frames, caption = _imagine_in_eval_mode(
        model, before, after, vocab, condition, stage, sample, generator
    )
    before, after = before[0].cpu(), after[0].cpu()
    frames = frames.cpu()
    strip = render_strip(before, frames, after, caption, tile)
    return ImaginedProcedure(codes.cpu(), probs.cpu(), frames, before, after, caption, head_note(stage), strip)


def _model_inputs(model: ProCap, before: Any, after: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Both images as (1, 3, S, S) batches on the model's device (see :func:`imagine` for what they may be)."""
    device = next(model.parameters()).device
    size = model.config.image_size
    return _as_batch(before, size, "before").to(device), _as_batch(after, size, "after").to(device)


def _imagine_in_eval_mode(
    model: ProCap,
    before: torch.Tensor,
    after: torch.Tensor,
    vocab: Vocabulary | None,
    condition: str | None,
    stage: str | None,
    sample: bool,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """``(codes (k, n), probabilities (k, n), frames (k, 3, S, S) in [0, 1], caption)`` of one pair (a batch of
    one on the model's device), with the model in eval mode and its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        caption_ids = _caption_ids(model, vocab, condition, before.device)
        logits = procedure_logits(model, before, after, caption_ids)[0]
        codes, probs = choose_codes(logits, sample, generator)  # (k, n)
        grid = model.config.latent_size
        frames = model.vqgan.decode_codes(codes, grid, grid).float().clamp(0.0, 1.0)  # (k, 3, S, S)
        caption = _strip_caption(model, vocab, before, after, condition, stage)
    finally:
        model.train(was_training)
    return codes, probs, frames, caption


def _caption_ids(
    model: ProCap, vocab: Vocabulary | None, condition: str | None, device: torch.device
) -> torch.Tensor | None:
    """(1, max_caption_len) ids of ``condition``, or None without one."""
    if condition is None:
        return None
    if vocab is None:
        raise ProCapError("imagine needs the checkpoint's vocabulary to condition on a caption (vocab=None).")
    ids = vocab.encode(condition, max_len=model.config.max_caption_len)
    return torch.tensor([ids], dtype=torch.long, device=device)


def _strip_caption(
    model: ProCap,
    vocab: Vocabulary | None,
    before: torch.Tensor,
    after: torch.Tensor,
    condition: str | None,
    stage: str | None,
) -> str:
    """The text under the strip: the conditioning caption, or the generated one (none from a stage-1 decoder)."""
    if condition is not None:
        return f"given caption: {condition}"
    if vocab is None:
        return ""
    if stage == "stage1" or getattr(model, "trained_stage", None) == "stage1":  # the file's own record counts too
        return "(no caption: a stage-1 checkpoint's decoder is untrained)"
    return model.caption_text(vocab, model.generate(before, after)[0].tolist())


def caption_font(size: int = FONT_SIZE) -> Font:
    """PIL's default font: the scalable one where Pillow has FreeType, else its small bitmap font."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()


def _to_pil(image: torch.Tensor, tile: int) -> Image.Image:
    """(3, S, S) in [0, 1] -> RGB PIL image of side ``tile`` (nearest-neighbour, so VQ tokens stay crisp)."""
    array = (image.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    picture = Image.fromarray(array, mode="RGB")
    return picture if picture.size == (tile, tile) else picture.resize((tile, tile), Image.Resampling.NEAREST)


def wrap_text(text: str, font: Font, width: int) -> list[str]:
    """Greedy word wrap of ``text`` into lines no wider than ``width`` pixels (a single long word stays whole)."""
    lines: list[str] = []
    for word in text.split():
        candidate = f"{lines[-1]} {word}" if lines else word
        if lines and font.getlength(candidate) <= width:
            lines[-1] = candidate
        else:
            lines.append(word)
    return lines


def strip_size(frames: int, tile: int, caption_lines: int, line_height: int) -> tuple[int, int]:
    """(width, height) of a strip with ``frames`` imagined frames and ``caption_lines`` lines of caption."""
    width = (frames + 2) * tile + (frames + 3) * GAP
    height = GAP + line_height + GAP + tile + GAP + caption_lines * line_height + (GAP if caption_lines else 0)
    return width, height


def line_height(font: Font) -> int:
    """Pixel height of one text line in ``font`` (ascent + descent + 2 px leading)."""
    return int(font.getbbox("Ag|")[3]) + 2


def render_strip(
    before: torch.Tensor, frames: torch.Tensor, after: torch.Tensor, caption: str = "", tile: int | None = None
) -> Image.Image:
    """Lay out before | frames | after with labels above and ``caption`` (wrapped) underneath.

    Args:
        before, after: (3, S, S) in [0, 1].
        frames: (k, 3, S, S) in [0, 1].
        caption: text under the images ('' for none).
        tile: side of each image (default: S, at least :data:`MIN_TILE`).

    Returns:
        An RGB image of :func:`strip_size`.
    """
    tile = tile or max(before.shape[-1], MIN_TILE)
    font = caption_font()
    step = line_height(font)
    images = [before, *frames, after]
    labels = ["before", *(f"imagined {i + 1}" for i in range(len(frames))), "after"]
    lines = wrap_text(caption, font, (len(images) * (tile + GAP)) - GAP)
    strip = Image.new("RGB", strip_size(len(frames), tile, len(lines), step), BACKGROUND)
    draw = ImageDraw.Draw(strip)
    for index, (image, label) in enumerate(zip(images, labels)):
        x = GAP + index * (tile + GAP)
        draw.text((x, GAP), label, fill=TEXT, font=font)
        strip.paste(_to_pil(image, tile), (x, 2 * GAP + step))
    for number, line in enumerate(lines):
        draw.text((GAP, 3 * GAP + step + tile + number * step), line, fill=TEXT, font=font)
    return strip


# ------------------------------------------------------------------------------ explicit procedure (stage-1 data)


@dataclass
class ExplicitProcedure:
    """What :func:`explicit_procedure` returns for one pair.

    Attributes:
        frames: (l + 2, 3, S, S) float32 in [0, 1]: before, the l interpolated frames, after.
        weights: (l,) float32 confidence of each interpolated frame, ``1 - softmax((s_bef - s_aft)^2)``.
        keyframes: (k,) int64 indices into ``frames`` (1 .. l, temporal order) of the sampled keyframes.
        strip: the PIL image (:func:`render_procedure_strip`).
    """

    frames: torch.Tensor
    weights: torch.Tensor
    keyframes: torch.Tensor
    strip: Image.Image


def explicit_procedure(
    frames: torch.Tensor,
    s_bef: torch.Tensor,
    s_aft: torch.Tensor,
    num_keyframes: int = 2,
    sampling: str = "topk",
    generator: torch.Generator | None = None,
    tile: int | None = None,
    caption: str = "",
) -> ExplicitProcedure:
    """Confidence scores and keyframes of a procedure, drawn as a strip.

    Args:
        frames: (l + 2, 3, S, S) float in [0, 1] (or uint8 0..255): before, P_1 .. P_l, after.
        s_bef, s_aft: (l + 2,) similarity of every frame to the before / after image.
        num_keyframes: keyframes to sample, 0 <= num_keyframes <= l.
        sampling: ``"topk"`` or ``"multinomial"`` (with ``generator``), as in stage-1 training.
        generator: RNG of the multinomial draw.
        tile: side of each image in the strip (default: S, at least :data:`MIN_TILE`).
        caption: text under the strip ('' for none).

    Returns:
        An :class:`ExplicitProcedure`.
    """
    # procap.procedure brings h5py (the [train] extra): imported where a procedure is drawn, so imagining with a
    # checkpoint works without it
    from procap.procedure.sampling import confidence_weights, sample_keyframes

    if frames.dtype == torch.uint8:
        frames = frames.float() / 255.0
    _check_procedure_shapes(frames, s_bef, s_aft)
    weights = confidence_weights(s_bef, s_aft)
    keyframes = sample_keyframes(weights, num_keyframes, sampling, generator)[1:-1]
    frames = frames.float().clamp(0.0, 1.0).cpu()
    strip = render_procedure_strip(frames, weights, keyframes, caption, tile)
    return ExplicitProcedure(frames, weights, keyframes, strip)


def _check_procedure_shapes(frames: torch.Tensor, s_bef: torch.Tensor, s_aft: torch.Tensor) -> None:
    """One sentence for frames that are no procedure, or similarities that do not score each of its frames."""
    if frames.dim() != 4 or frames.shape[1] != 3 or frames.shape[0] < 3:
        raise ProCapError(f"frames must be (l + 2, 3, S, S) with l >= 1, got {tuple(frames.shape)}.")
    if s_bef.shape != (frames.shape[0],) or s_aft.shape != (frames.shape[0],):
        raise ProCapError(
            f"{frames.shape[0]} frames need {frames.shape[0]} similarities each, got {tuple(s_bef.shape)} and "
            f"{tuple(s_aft.shape)}."
        )


def procedure_from_cache(cache: Any, pair_id: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The stored procedure of one pair: ``(frames (l + 2, 3, S, S) uint8, s_bef (l + 2,), s_aft (l + 2,))``.

    Args:
        cache: a :class:`procap.procedure.ProcedureCache` (ours, or the authors' files with their score JSON).
        pair_id: the pair's id; :class:`ProCapError` when the cache has no entry for it.
    """
    group, key = cache.locate(pair_id)
    s_bef, s_aft = cache.similarities(group, key)
    frames = torch.from_numpy(cache.frames(group, key))
    if s_bef.shape[0] != frames.shape[0]:
        raise ProCapError(f"cache entry {key}: {s_bef.shape[0]} similarity scores for {frames.shape[0]} frames.")
    return frames, s_bef.float(), s_aft.float()


@torch.no_grad()
def procedure_from_pair(
    pair: Any, interpolator: Any, similarity: Any, num_generated: int = 7, size: int = 224, direct: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthesize and score one pair's procedure now, as ``procap prepare`` would store it.

    Args:
        pair: a :class:`procap.data.ChangePair`.
        interpolator: a :class:`procap.procedure.Interpolator` (e.g. ``FlowInterpolator()``).
        similarity: a :class:`procap.procedure.Similarity` (e.g. ``VQGANSimilarity(vqgan)``).
        num_generated: l in {3, 7, 15}.
        size: side S the images are loaded at.
        direct: all l frames from the endpoints' flow when the interpolator can (else recursive midpoints).

    Returns:
        ``(frames (l + 2, 3, S, S) uint8, s_bef (l + 2,), s_aft (l + 2,))``, quantised to uint8 like the cache.
    """
    from procap.procedure.interpolate import generate_procedure  # h5py: see explicit_procedure
    from procap.procedure.pipeline import read_pair, to_uint8

    before, after = read_pair(pair, size)
    middle = generate_procedure(
        before, after, interpolator, num_generated, direct and hasattr(interpolator, "frames_at")
    )
    frames = torch.from_numpy(to_uint8(torch.cat([before[None], middle, after[None]], dim=0)))
    s_bef, s_aft = similarity(frames.float() / 255.0)
    return frames, s_bef.float().cpu(), s_aft.float().cpu()


def flat_scores_note(weights: torch.Tensor, below: float = 1e-3) -> str:
    """A warning when the confidences span less than ``below`` (the keyframes then follow rounding), else ''."""
    spread = float(weights.max() - weights.min()) if weights.numel() > 1 else 1.0
    if spread >= below:
        return ""
    return (
        f"the scores are nearly equal (spread {spread:.1e}): the similarity model hardly tells the frames apart, "
        "so the keyframes are decided by rounding and ties (top-k takes the earlier frame)"
    )


def procedure_strip_size(frames: int, tile: int, caption_lines: int, line_height: int) -> tuple[int, int]:
    """(width, height) of a procedure strip of ``frames`` images (l + 2) and ``caption_lines`` lines of caption."""
    width = frames * tile + (frames + 1) * GAP
    height = GAP + line_height + GAP + tile + GAP + BAR_HEIGHT + GAP + line_height + GAP
    return width, height + caption_lines * line_height + (GAP if caption_lines else 0)


def render_procedure_strip(
    frames: torch.Tensor, weights: torch.Tensor, keyframes: torch.Tensor, caption: str = "", tile: int | None = None
) -> Image.Image:
    """before | P_1 .. P_l | after, a confidence bar and score under each P_i, keyframes outlined in colour.

    Args:
        frames: (l + 2, 3, S, S) in [0, 1].
        weights: (l,) confidence scores in [0, 1]; a bar spanning the tile is a score of 1.
        keyframes: (k,) indices into ``frames`` (1 .. l) to outline with :data:`KEY_COLOUR`.
        caption: text under the strip ('' for none).
        tile: side of each image (default: S, at least :data:`MIN_TILE`).

    Returns:
        An RGB image of :func:`procedure_strip_size`.
    """
    tile = tile or max(frames.shape[-1], MIN_TILE)
    font = caption_font()
    step = line_height(font)
    count = frames.shape[0]
    keys = {int(i) for i in keyframes}
    lines = wrap_text(caption, font, count * (tile + GAP) - GAP)
    strip = Image.new("RGB", procedure_strip_size(count, tile, len(lines), step), BACKGROUND)
    draw = ImageDraw.Draw(strip)
    top, bar_top = 2 * GAP + step, 3 * GAP + step + tile
    for index in range(count):
        x = GAP + index * (tile + GAP)
        label = "before" if index == 0 else "after" if index == count - 1 else f"P{index}" + (" key" * (index in keys))
        draw.text((x, GAP), label, fill=KEY_COLOUR if index in keys else TEXT, font=font)
        if index in keys:
            border = (x - KEY_BORDER, top - KEY_BORDER, x + tile + KEY_BORDER - 1, top + tile + KEY_BORDER - 1)
            draw.rectangle(border, fill=KEY_COLOUR)
        strip.paste(_to_pil(frames[index], tile), (x, top))
        if 0 < index < count - 1:
            _draw_confidence(draw, (x, bar_top), tile, float(weights[index - 1]), font)
    for number, line in enumerate(lines):
        draw.text((GAP, 5 * GAP + 2 * step + tile + BAR_HEIGHT + number * step), line, fill=TEXT, font=font)
    return strip


def _draw_confidence(draw: ImageDraw.ImageDraw, corner: tuple[int, int], tile: int, score: float, font: Font) -> None:
    """A frame's confidence under its tile: a bar across the tile filled to ``score`` and the score below it."""
    x, top = corner
    draw.rectangle((x, top, x + tile - 1, top + BAR_HEIGHT - 1), fill=BAR_TRACK)
    filled = round(min(max(score, 0.0), 1.0) * tile)
    if filled:
        draw.rectangle((x, top, x + filled - 1, top + BAR_HEIGHT - 1), fill=BAR_COLOUR)
    draw.text((x, top + BAR_HEIGHT + GAP), f"{score:.3f}", fill=TEXT, font=font)
