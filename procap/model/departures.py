"""The ``tiny`` preset's departures from the paper inside the procedure encoder (docs/model.md, "Departures").

Every module and function here is an addition the paper's model does not have, on only where
``ProCapConfig.departures`` (:class:`procap.core.config.Departures`) turns it on; the paper's encoder is
:mod:`procap.model.encoder`. :class:`DepartureEmbeddings` is a base class of
:class:`procap.model.encoder.ProcedureEncoder`: it builds the departures' embeddings on the encoder itself
(:meth:`DepartureEmbeddings.build_departures`), so their parameters keep their checkpoint keys
(``encoder.change_mlp.0.weight``, ``encoder.image_encoder.layers.0.weight``, ...), and embeds what they add:

- the learned image features (:class:`ImageEncoder`, :meth:`DepartureEmbeddings.image_features`,
  :meth:`DepartureEmbeddings.with_image_features`) and the per-channel standardisation of the tokenizer's features
  (``feature_norm``);
- merged tokens (:func:`space_to_depth`, :func:`depth_to_space`);
- the difference embedding (:meth:`DepartureEmbeddings.embed_difference`, :func:`joint_cells`);
- the change token and its window (:meth:`DepartureEmbeddings.change_cells`, :meth:`DepartureEmbeddings.embed_change`:
  :class:`PixelCNN`, :func:`pixel_cells`, learned localisation, :func:`window_origin`, :func:`window_cells`,
  :class:`WindowGlimpse`, :func:`window_pixels`).

:class:`procap.model.sequence.SequenceAssembly` decides where in the sequence each goes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from procap.core.config import ProCapConfig

# The encoder's front end, by attribute name: every module that embeds the frames before the transformer stack,
# the paper's (visual_norm, visual_proj) and the departures'. ``Departures.restart_front_end`` draws them anew when
# stage 2 starts from stage 1. feature_norm is not among them: its running statistics describe the frozen
# tokenizer's features, which stage 1 and stage 2 share.
FRONT_END_MODULES = (
    "visual_norm",
    "visual_proj",
    "image_encoder",
    "image_norm",
    "image_proj",
    "difference_norm",
    "difference_proj",
    "difference_mlp",
    "pixel_cnn",
    "change_mlp",
    "change_embedding",
    "change_temperature",
    "change_score",
    "window_glimpse",
    "window_mlp",
    "window_pos",
)


class DepartureEmbeddings(nn.Module):
    """The departures' embeddings of the procedure encoder (a base class: the encoder holds their parameters).

    Attributes (set by :meth:`build_departures`; a module a departure does not use is absent or None):
        feature_norm: BatchNorm2d(z, affine=False) with ``standardize_features``, else Identity.
        token_merge: m, latent cells per token side; difference_mode: ``"absolute"`` or ``"joint"``.
        image_encoder, image_norm, image_proj: :class:`ImageEncoder` and the LayerNorm + Linear of its merged cells.
        difference_norm, difference_proj (``"absolute"``) or difference_mlp (``"joint"``): the difference embedding.
        change_mlp, change_embedding, change_temperature, change_score, pixel_cnn, change_pixels: the change token.
        change_window, window_glimpse, window_mlp, window_pos: the change window's tokens.
    """

    feature_norm: nn.Module
    token_merge: int
    difference_mode: str
    image_encoder: ImageEncoder | None
    change_window: int

    def build_departures(self, config: ProCapConfig) -> None:
        """Build the embeddings ``config.departures`` turns on; their forward reads these attributes, not the config.

        Called by the encoder's constructor after its stack and before its heads: the order the modules are built in
        is the order their initial weights are drawn in, so it stays that of every checkpoint trained so far.
        """
        d, z = config.enc_dim, config.vqgan.z_channels
        departures = config.departures
        # departure (docs/model.md): per-channel standardisation of the tokenizer's features (running statistics,
        # no affine); a well-trained VQGAN's channels carry offsets of ~2 standard deviations that a per-token
        # LayerNorm turns into near-constant tokens
        self.feature_norm = nn.BatchNorm2d(z, affine=False) if departures.standardize_features else nn.Identity()
        self.token_merge = departures.token_merge
        self.difference_mode = departures.difference_mode
        cell = config.image_size // config.latent_size  # pixels per latent cell side
        learned = departures.image_encoder
        self.image_encoder = ImageEncoder(learned, cell) if learned else None
        if learned:
            # departure (docs/model.md): features learned with the captioner join every frame's tokens
            self.image_norm = nn.LayerNorm(learned * departures.token_merge**2)
            self.image_proj = nn.Linear(learned * departures.token_merge**2, d)
        differenced = (z + learned) * departures.token_merge**2  # what the difference embedding reads of a token
        if departures.difference_embedding and departures.difference_mode == "absolute":
            # departure (docs/model.md): |after - before| per position
            self.difference_norm = nn.LayerNorm(differenced)
            self.difference_proj = nn.Linear(differenced, d)
        elif departures.difference_embedding:  # "joint": signed [before, after, after - before] per cell, then an MLP
            self.difference_mlp = nn.Sequential(nn.Linear(3 * differenced, d), nn.GELU(), nn.Linear(d, d))
        self._build_change_token(config, cell)

    def _build_change_token(self, config: ProCapConfig, cell: int) -> None:
        """:meth:`build_departures`' change token and its window (what ``departures.change_token`` turns on)."""
        d, z = config.enc_dim, config.vqgan.z_channels
        departures = config.departures
        self.change_score: nn.Module | None = None
        pixels = 0  # what a cell's change input holds beyond the tokenizer's [before, after, after - before]
        if departures.change_token:
            # departure (docs/model.md): one token pooled over the latent cells, weighted by their change
            self.change_pixels = departures.change_pixels
            pixels = 2 * 3 * cell * cell if departures.change_pixels else 0
            # [before, after, after - before] of the learned features (one CNN or the other: Departures.check)
            pixels += 3 * (departures.pixel_cnn + departures.image_encoder)
            self.pixel_cnn = PixelCNN(departures.pixel_cnn, cell) if departures.pixel_cnn else None
            self.change_mlp = nn.Sequential(nn.Linear(3 * z + pixels, d), nn.GELU(), nn.Linear(d, d))
            self.change_embedding = nn.Parameter(torch.zeros(d))
            self.change_temperature = nn.Parameter(torch.tensor(CHANGE_TEMPERATURE))
            if departures.learned_localisation:
                # departure (docs/model.md): a learned score per cell, added to the parameter-free one
                self.change_score = nn.Sequential(nn.Linear(3 * z + pixels, d), nn.GELU(), nn.Linear(d, 1))
        self.change_window = departures.change_window
        self.window_glimpse: WindowGlimpse | None = None
        if departures.change_window:  # a window needs the change token (Departures.check)
            # departure (docs/model.md): the cells around the strongest change, a token each, with their place
            glimpse = departures.window_glimpse
            if glimpse:
                self.window_glimpse = WindowGlimpse(glimpse, config.image_size // config.latent_size)
            self.window_mlp = nn.Sequential(nn.Linear(3 * z + pixels + glimpse, d), nn.GELU(), nn.Linear(d, d))
            self.window_pos = nn.Parameter(torch.zeros(departures.change_window**2, d))

    def image_features(self, images: torch.Tensor) -> torch.Tensor | None:
        """The learned features of images (B, T, 3, S, S) in [0, 1]: (B, T, c, h, w) on the latent grid, or None
        without ``departures.image_encoder``."""
        if self.image_encoder is None:
            return None
        b, t = images.shape[:2]
        features = self.image_encoder(images.flatten(0, 1))
        return features.view(b, t, *features.shape[1:])

    def with_image_features(self, embedded: torch.Tensor, learned: torch.Tensor | None) -> torch.Tensor:
        """Visual tokens (B, T*n, enc_dim) plus, with ``departures.image_encoder``, the learned features ``learned``
        (B, T, c, h, w) of the same frames, merged like the tokenizer's and added through their own LayerNorm and
        projection; ``embedded`` itself without it."""
        if self.image_encoder is None:
            return embedded
        if learned is None:
            raise ValueError("this model's tokens read the images: pass their image_features")
        b = embedded.shape[0]
        cells = space_to_depth(learned.flatten(0, 1).to(embedded.dtype), self.token_merge)
        return embedded + self.image_proj(self.image_norm(cells.reshape(b, -1, cells.shape[-1])))

    def embed_difference(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        learned_before: torch.Tensor | None = None,
        learned_after: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-position change embedding: VQGAN features (B, z, h, w) x 2 -> (B, n, enc_dim), row-major.

        ``difference_mode`` "absolute": LayerNorm -> Linear of ``|after - before|``. "joint": an MLP of the signed
        ``[before, after, after - before]`` of every cell, each frame LayerNormed per cell first (no affine) so the
        difference keeps its size: near zero where nothing changed, large at the change, and it tells add from drop.
        With ``departures.image_encoder`` the learned features (B, c, h, w) x 2 join the tokenizer's per cell.
        Only built with ``departures.difference_embedding``.
        """
        before, after = self.feature_norm(before), self.feature_norm(after)
        if self.image_encoder is not None:
            if learned_before is None or learned_after is None:
                raise ValueError("this model's difference reads the images: pass their image_features")
            before = torch.cat([before, learned_before.to(before.dtype)], dim=1)
            after = torch.cat([after, learned_after.to(after.dtype)], dim=1)
        if self.difference_mode == "absolute":
            change = space_to_depth((after - before).abs(), self.token_merge)  # (B, n, z*m^2)
            return self.difference_proj(self.difference_norm(change))
        return self.difference_mlp(space_to_depth(joint_cells(before, after), self.token_merge))

    def change_cells(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        before_pixels: torch.Tensor | None = None,
        after_pixels: torch.Tensor | None = None,
        learned_before: torch.Tensor | None = None,
        learned_after: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the change tokens read of every latent cell, and how much it changed.

        Returns:
            ``(cells (B, C, h, w), magnitude (B, h, w))``: the standardised ``[before, after, after - before]`` (with
            ``departures.change_pixels`` also the cell's raw pixels in both images, + 2 * 3 * cell^2 channels, and with
            ``departures.pixel_cnn`` or ``departures.image_encoder`` c the learned ``[before, after, after - before]``
            features, + 3c: ``learned_before`` / ``learned_after`` (B, c, h, w) for the image encoder) and the rms of
            ``after - before`` over the tokenizer's channels.
        """
        cells = joint_cells(self.feature_norm(before), self.feature_norm(after))  # (B, 3z, h, w)
        z, side = before.shape[1], before.shape[-1]
        magnitude = cells[:, 2 * z :].square().mean(1).sqrt()
        reads_images = self.change_pixels or self.pixel_cnn is not None or self.window_glimpse is not None
        if reads_images and (before_pixels is None or after_pixels is None):
            raise ValueError("this model's change token reads the images: pass before_pixels and after_pixels")
        if self.image_encoder is not None and (learned_before is None or learned_after is None):
            raise ValueError("this model's change token reads the images: pass their image_features")
        # both images, or none when no part reads them (refused above when one does and they are missing)
        images = [] if before_pixels is None or after_pixels is None else [before_pixels, after_pixels]
        parts = [cells]
        if self.change_pixels:
            cell = images[0].shape[-1] // side
            parts += [pixel_cells(image.to(cells.dtype), cell) for image in images]
        if self.pixel_cnn is not None:
            features = self.pixel_cnn(torch.cat(images).to(cells.dtype))
            learned_before, learned_after = features.chunk(2)
        if learned_before is not None and learned_after is not None:
            parts.append(joint_cells(learned_before.to(cells.dtype), learned_after.to(cells.dtype)))
        return torch.cat(parts, dim=1) if len(parts) > 1 else cells, magnitude

    def embed_change(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        before_pixels: torch.Tensor | None = None,
        after_pixels: torch.Tensor | None = None,
        learned_before: torch.Tensor | None = None,
        learned_after: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The change tokens: VQGAN features (B, z, h, w) x 2 (and images (B, 3, S, S) x 2) -> (B, 1 + w^2, enc_dim).

        The first token: an MLP embeds each latent cell (:meth:`change_cells`) and the cells are averaged with
        weights ``softmax(score)``, so it describes what is at the changed cells. The score is
        ``temperature * rms(after - before)`` (the temperature is learned), plus with
        ``departures.learned_localisation`` a learned function of each cell's inputs. With
        ``departures.change_window`` w, w^2 more tokens follow: the w x w cells around the highest score (the peak
        of its 3 x 3 box sum, the window clipped to the grid), each embedded by its own MLP plus a learned embedding
        of its place in the window, so the object's shape and size survive; with ``departures.window_glimpse`` that
        MLP also reads :class:`WindowGlimpse`'s features of the window's pixels at full resolution. Only built with
        ``departures.change_token``.

        ``hidden`` (B, h, w) bool marks cells the tokens must not read (stage 1's masked ends): they get no pooling
        weight, are never the window's centre, and read as zeros, pixels included.
        """
        if hidden is not None and before_pixels is not None and after_pixels is not None:
            cell = before_pixels.shape[-1] // before.shape[-1]
            shown = (~hidden).to(before_pixels.dtype).repeat_interleave(cell, 1).repeat_interleave(cell, 2)
            before_pixels, after_pixels = before_pixels * shown[:, None], after_pixels * shown[:, None]
        cells, magnitude = self.change_cells(before, after, before_pixels, after_pixels, learned_before, learned_after)
        if hidden is not None:
            cells = cells * (~hidden)[:, None].to(cells.dtype)
        pooled, score = self._pooled_change_token(cells, magnitude, hidden)
        if not self.change_window:
            return pooled
        window = self._window_cells(cells, magnitude, score, hidden, before_pixels, after_pixels)
        tokens = self.window_mlp(window) + self.window_pos.to(pooled.dtype)
        return torch.cat([pooled, tokens.to(pooled.dtype)], dim=1)

    def _pooled_change_token(
        self, cells: torch.Tensor, magnitude: torch.Tensor, hidden: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first change token (B, 1, D), the cells' embeddings pooled with weights ``softmax(score)``, and that
        (B, h*w) score (hidden cells at ``HIDDEN_SCORE``), which also places the window."""
        inputs = cells.flatten(2).transpose(1, 2)  # (B, h*w, C)
        score = self.change_temperature * magnitude.flatten(1)
        if self.change_score is not None:
            score = score + self.change_score(inputs).squeeze(-1).to(score.dtype)
        if hidden is not None:
            score = score.masked_fill(hidden.flatten(1), HIDDEN_SCORE)
        weights = torch.softmax(score, dim=1)
        if hidden is not None:  # every cell hidden: no weight at all (the token is its embedding alone)
            weights = weights * (~hidden).flatten(1).to(weights.dtype)
        embedded = self.change_mlp(inputs)  # (B, h*w, D)
        pooled = torch.einsum("bn,bnd->bd", weights.to(embedded.dtype), embedded)
        return (pooled + self.change_embedding.to(pooled.dtype)).unsqueeze(1), score

    def _window_cells(
        self,
        cells: torch.Tensor,
        magnitude: torch.Tensor,
        score: torch.Tensor,
        hidden: torch.Tensor | None,
        before_pixels: torch.Tensor | None,
        after_pixels: torch.Tensor | None,
    ) -> torch.Tensor:
        """What the window's tokens read, (B, w*w, C): the w x w cells around the highest score, with
        ``departures.window_glimpse`` also :class:`WindowGlimpse`'s features of their pixels."""
        # The parameter-free rule places the window by the magnitude itself (the temperature only sharpens pooling)
        place = magnitude if self.change_score is None else score.detach().view_as(magnitude)
        if hidden is not None:
            place = place.masked_fill(hidden, HIDDEN_SCORE)
        top, left = window_origin(place, self.change_window)
        window = window_cells(cells, top, left, self.change_window)  # (B, w*w, C)
        if self.window_glimpse is not None:
            # change_cells has refused a model with a glimpse its images: both are here
            assert before_pixels is not None and after_pixels is not None
            cell = before_pixels.shape[-1] // magnitude.shape[-1]
            size = self.change_window
            crops = [
                window_pixels(image.to(cells.dtype), top, left, size, cell) for image in (before_pixels, after_pixels)
            ]
            window = torch.cat([window, self.window_glimpse(*crops).to(window.dtype)], dim=-1)
        return window


class PixelCNN(nn.Module):
    """Images (B, 3, S, S) in [0, 1] -> features (B, c, S / cell, S / cell), one vector per latent cell.

    A convolution with the cell as kernel and stride (each cell's pixels, linearly), then two 3 x 3 convolutions
    on the latent grid (receptive field 5 cells: a whole object and its edges), GELU between them. Trained with
    the captioner, unlike the frozen tokenizer; working on the latent grid from the first layer keeps it cheap
    (a full-resolution first layer made a CPU step 25 % slower, mostly in its backward).
    """

    def __init__(self, channels: int, cell: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*down_to_latent_grid(3, channels, cell))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images * 2 - 1)


def down_to_latent_grid(inputs: int, channels: int, cell: int) -> list[nn.Module]:
    """A convolution with the latent cell as kernel and stride, then two 3 x 3 on the latent grid, GELU between."""
    return [
        nn.Conv2d(inputs, channels, cell, stride=cell),
        nn.GELU(),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.GELU(),
        nn.Conv2d(channels, channels, 3, padding=1),
    ]


class ImageEncoder(nn.Module):
    """Images (N, 3, S, S) in [0, 1] -> learned features (N, c, S / cell, S / cell), one vector per latent cell.

    A 3 x 3 convolution at full resolution (edges and corners are a pixel or two wide), a convolution with the cell
    as kernel and stride down to the latent grid, then two 3 x 3 convolutions there (receptive field 5 cells plus a
    pixel: an object, its edges and a shift of the view), GELU between them. Trained with the captioner: unlike the
    frozen tokenizer's codes, its features can learn to ignore a small change of view (docs/model.md).
    """

    def __init__(self, channels: int, cell: int) -> None:
        super().__init__()
        first = max(8, channels // 2)
        self.layers = nn.Sequential(
            nn.Conv2d(3, first, 3, padding=1), nn.GELU(), *down_to_latent_grid(first, channels, cell)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images * 2 - 1)


class WindowGlimpse(nn.Module):
    """The change window's pixels at full resolution -> a feature vector per window cell.

    Input: the before and after crops (B, 3, P, P), P = w * cell, in [0, 1]; the CNN reads ``[before, after,
    after - before]``. Two 3 x 3 convolutions at full resolution (the edges and corners that tell a cube from a
    cylinder are a pixel or two wide), a convolution with the cell as kernel and stride down to the window's
    cells, and a 3 x 3 on the cells (receptive field 16 px: a whole object). Output (B, w * w, c), row-major.
    Only the window is read at full resolution, so it costs a fraction of a full-image CNN.
    """

    def __init__(self, channels: int, cell: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(9, channels, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(channels, channels, cell, stride=cell),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding=1),
        )

    def forward(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        before, after = before * 2 - 1, after * 2 - 1
        features = self.layers(torch.cat([before, after, after - before], dim=1))
        return features.flatten(2).transpose(1, 2)


CHANGE_TEMPERATURE = 10.0  # initial sharpness of the change token's pooling (cells of unit-variance features)
HIDDEN_SCORE = -1e4  # the pooling score of a hidden cell: no weight after the softmax, never the window's centre


def space_to_depth(x: torch.Tensor, merge: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, (H/m)*(W/m), m*m*C) tokens, row-major, each holding its m x m cells (order dy, dx, c).

    ``merge`` 1 gives the plain row-major (N, H*W, C) layout.
    """
    n, c, h, w = x.shape
    m = merge
    cells = x.reshape(n, c, h // m, m, w // m, m).permute(0, 2, 4, 3, 5, 1)  # (N, H/m, W/m, dy, dx, C)
    return cells.reshape(n, (h // m) * (w // m), m * m * c)


def depth_to_space(tokens: torch.Tensor, merge: int) -> torch.Tensor:
    """Inverse of :func:`space_to_depth`: (N, g*g, m*m*C) -> (N, C, g*m, g*m) for a square token grid of side g."""
    n, count, channels = tokens.shape
    g, m = math.isqrt(count), merge
    c = channels // (m * m)
    cells = tokens.reshape(n, g, g, m, m, c).permute(0, 5, 1, 3, 2, 4)  # (N, C, gy, dy, gx, dx)
    return cells.reshape(n, c, g * m, g * m)


def pixel_cells(images: torch.Tensor, cell: int) -> torch.Tensor:
    """(B, 3, S, S) -> (B, 3 * cell^2, S / cell, S / cell): each latent cell's pixels as its channels."""
    b, _, size, _ = images.shape
    side = size // cell
    return space_to_depth(images, cell).transpose(1, 2).reshape(b, -1, side, side)


def window_origin(magnitude: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left cell (row, column), each (B,), of the ``size`` x ``size`` window around the strongest change.

    The centre is the peak of the magnitude (B, h, w) summed over each cell's 3 x 3 neighbourhood, its own cell
    counted twice (one noisy cell does not win against an object; a lone changed cell is its own centre); the
    window is moved inside the grid rather than padded, so every cell it holds is real.
    """
    h, w = magnitude.shape[-2:]
    magnitude = magnitude.unsqueeze(1).float()
    score = 9 * F.avg_pool2d(magnitude, 3, stride=1, padding=1, count_include_pad=True) + magnitude
    peak = score.flatten(1).argmax(dim=1)
    top = (peak // w - size // 2).clamp(0, h - size)
    left = (peak % w - size // 2).clamp(0, w - size)
    return top, left


def crop(grid: torch.Tensor, top: torch.Tensor, left: torch.Tensor, size: int) -> torch.Tensor:
    """A ``size`` x ``size`` square of every map in ``grid`` (B, C, H, W), each at its own top-left ``(top, left)``
    (B,): (B, size, size, C), channels last. An index, so the corner is not differentiated; the values are."""
    offsets = torch.arange(size, device=grid.device)
    rows = (top[:, None] + offsets)[:, :, None]  # (B, size, 1)
    cols = (left[:, None] + offsets)[:, None, :]  # (B, 1, size)
    batch = torch.arange(grid.shape[0], device=grid.device)[:, None, None]
    return grid.permute(0, 2, 3, 1)[batch, rows, cols]


def window_cells(cells: torch.Tensor, top: torch.Tensor, left: torch.Tensor, size: int) -> torch.Tensor:
    """The cells (B, C, h, w) of the window at ``(top, left)``: (B, size^2, C), row-major within the window."""
    return crop(cells, top, left, size).reshape(cells.shape[0], size * size, -1)


def window_pixels(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, size: int, cell: int) -> torch.Tensor:
    """The pixels (B, 3, size * cell, size * cell) of images (B, 3, S, S) under the window of ``size`` x ``size``
    latent cells of side ``cell`` px whose top-left cell is ``(top, left)``."""
    return crop(images, top * cell, left * cell, size * cell).permute(0, 3, 1, 2)


def joint_cells(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``[before, after, after - before]`` per latent cell, (B, z, h, w) x 2 -> (B, 3z, h, w).

    Signed and not normalised per cell, so the difference keeps its size: near zero where nothing changed, large
    at the change, and opposite for add and drop. The scale is the caller's (``feature_norm``).
    """
    return torch.cat([before, after, after - before], dim=1)
