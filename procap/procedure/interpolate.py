"""Frame interpolation: turn (I_bef, I_aft) into l intermediate frames.

The paper synthesises the change procedure with VFIformer, whose output has the form
``I_t = H * warp(I_bef, F_t->0) + (1 - H) * warp(I_aft, F_t->1) (+ a learned residual)``. We ship a
weight-free interpolator of the same form (:class:`FlowInterpolator`) and a cross-fade baseline
(:class:`CrossFade`). Any callable ``(before, after) -> middle`` on batched [0, 1] tensors plugs in
(:class:`Interpolator`), e.g. a wrapper around RIFE or VFIformer.

``generate_procedure`` builds ``l = 2**m - 1`` frames by recursive midpoints, as the paper does.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from procap.core.config import GENERATED_FRAME_COUNTS


@runtime_checkable
class Interpolator(Protocol):
    """Anything that synthesises the middle frame of a pair, batched.

    Args:
        before: (B, 3, H, W) float in [0, 1].
        after: (B, 3, H, W) float in [0, 1], same shape and device.

    Returns:
        (B, 3, H, W) float in [0, 1]: the frame half-way between them.
    """

    def __call__(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor: ...


class CrossFade:
    """Baseline: the pixel-wise average (or ``(1 - t) * before + t * after``). No motion at all."""

    def __call__(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        return self.at(before, after, 0.5)

    def at(self, before: torch.Tensor, after: torch.Tensor, t: float) -> torch.Tensor:
        return (1.0 - t) * before + t * after

    def frames_at(self, before: torch.Tensor, after: torch.Tensor, times: list[float]) -> torch.Tensor:
        """(B, 3, H, W) x 2 -> (B, len(times), 3, H, W)."""
        return torch.stack([self.at(before, after, t) for t in times], dim=1)


# ----------------------------------------------------------------------------------------------------------
# torch helpers (run on whatever device the images are on)


def _pixel_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """(1, 2, H, W) pixel coordinates (x, y)."""
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device, dtype=torch.float32),
        torch.arange(w, device=device, dtype=torch.float32),
        indexing="ij",
    )
    return torch.stack([xs, ys]).unsqueeze(0)


def backward_warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """Sample ``image`` at ``x + flow(x)`` (bilinear, border padding).

    Args:
        image: (B, C, H, W).
        flow: (B, 2, H, W) displacement in pixels, channel 0 = x, 1 = y.

    Returns:
        (B, C, H, W).
    """
    _b, _, h, w = image.shape
    pos = _pixel_grid(h, w, image.device) + flow.float()
    # grid_sample wants (x, y) normalised to [-1, 1] with align_corners=True: -1 = pixel 0, +1 = pixel W-1.
    gx = 2.0 * pos[:, 0] / max(w - 1, 1) - 1.0
    gy = 2.0 * pos[:, 1] / max(h - 1, 1) - 1.0
    grid = torch.stack([gx, gy], dim=-1)  # (B, H, W, 2)
    return F.grid_sample(image.float(), grid, mode="bilinear", padding_mode="border", align_corners=True)


def forward_splat(values: torch.Tensor, flow: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear forward splatting: every source pixel x adds ``weight * values`` around ``x + flow(x)``.

    Args:
        values: (B, C, H, W) what to splat.
        flow: (B, 2, H, W) where each pixel goes, in pixels.
        weight: (B, 1, H, W) non-negative importance of each source pixel.

    Returns:
        ``(sums (B, C, H, W), weight_sums (B, 1, H, W))``; the splatted mean is ``sums / weight_sums``.
    """
    b, c, h, w = values.shape
    pos = _pixel_grid(h, w, values.device) + flow.float()
    x0, y0 = pos[:, 0].floor(), pos[:, 1].floor()
    fx, fy = pos[:, 0] - x0, pos[:, 1] - y0
    payload = torch.cat([values.float() * weight, weight], dim=1).reshape(b, c + 1, h * w)
    out = torch.zeros(b, c + 1, h * w, device=values.device, dtype=torch.float32)
    for dx, dy, bw in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
        xi, yi = x0 + dx, y0 + dy
        inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        index = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).long().reshape(b, 1, h * w)
        contrib = payload * (bw * inside).reshape(b, 1, h * w)
        out.scatter_add_(2, index.expand(b, c + 1, h * w), contrib)
    out = out.reshape(b, c + 1, h, w)
    return out[:, :c], out[:, c:]


# ----------------------------------------------------------------------------------------------------------
# optical flow (OpenCV DIS, CPU)


def _to_gray_u8(images: torch.Tensor, scale: float) -> list[np.ndarray]:
    """(B, 3, H, W) float [0, 1] -> list of uint8 grayscale (H*scale, W*scale) arrays."""
    rgb = (images.detach().float().clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    out = []
    for img in rgb:
        gray = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)
        if scale != 1.0:
            gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
        out.append(gray)
    return out


def _to_rgb_f32(images: torch.Tensor) -> np.ndarray:
    """(B, 3, H, W) float [0, 1] -> (B, H, W, 3) float32 numpy."""
    return np.ascontiguousarray(images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy())


def _change_components(a: np.ndarray, b: np.ndarray, threshold: float, min_area: int) -> tuple[np.ndarray, list]:
    """Connected regions where two (H, W, 3) images differ: (change mask (H, W) bool, [(label mask, bbox)])."""
    diff = cv2.GaussianBlur(np.abs(a - b).max(axis=2), (3, 3), 0)
    mask = (diff > threshold).astype(np.uint8)
    mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((2, 2), np.uint8))
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    comps = []
    for i in range(1, count):
        x, y, w, h, area = stats[i]
        if area >= min_area:
            comps.append((labels == i, (int(x), int(y), int(w), int(h))))
    return mask.astype(bool), comps


def _match_component(
    src: np.ndarray, dst: np.ndarray, comp: np.ndarray, bbox: tuple[int, int, int, int], changed: np.ndarray
) -> tuple[int, int] | None:
    """Where did the content of ``src`` under ``comp`` go in ``dst``? A unique, change-to-change match or None.

    Large-displacement seeding (in the spirit of LDOF's descriptor matches): the masked patch is searched in
    the whole of ``dst`` by sum of squared differences. A match is accepted only if it is (1) much better than
    staying put, (2) unique (a flat background patch matches everywhere and is rejected), and (3) lands on a
    changed region too (a static look-alike object elsewhere is not where the content went).
    """
    x, y, w, h = bbox
    hh, ww = src.shape[:2]
    if w >= ww - 1 or h >= hh - 1:
        return None
    template = np.ascontiguousarray(src[y : y + h, x : x + w])
    tmask = cv2.dilate(comp[y : y + h, x : x + w].astype(np.uint8), np.ones((3, 3), np.uint8))
    tmask3 = np.repeat(tmask[:, :, None].astype(np.float32), 3, axis=2)
    err = cv2.matchTemplate(dst, template, cv2.TM_SQDIFF, mask=tmask3) / max(float(tmask3.sum()), 1.0)
    err = np.nan_to_num(err, nan=np.inf, posinf=np.inf)
    by, bx = np.unravel_index(np.argmin(err), err.shape)
    best, stay = float(err[by, bx]), float(err[y, x])
    dx, dy = int(bx) - x, int(by) - y
    if dx * dx + dy * dy < 4 or not best < 0.25 * stay:
        return None
    # uniqueness: the best match outside a patch-sized window around the winner must be clearly worse
    masked = err.copy()
    ry, rx = max(h // 2, 2), max(w // 2, 2)
    masked[max(by - ry, 0) : by + ry + 1, max(bx - rx, 0) : bx + rx + 1] = np.inf
    second = float(masked.min()) if np.isfinite(masked).any() else np.inf
    if not best < 0.5 * second:
        return None
    landed = changed[by : by + h, bx : bx + w][tmask > 0]
    return (dx, dy) if landed.size and landed.mean() >= 0.5 else None


def seed_flow(a: np.ndarray, b: np.ndarray, threshold: float = 0.08, min_area: int = 4, grow: int = 2) -> np.ndarray:
    """Sparse large-displacement flow a -> b from matched change regions: (H, W, 2), NaN where unseeded."""
    changed, comps = _change_components(a, b, threshold, min_area)
    seed = np.full(a.shape[:2] + (2,), np.nan, dtype=np.float32)
    for comp, bbox in comps:
        match = _match_component(a, b, comp, bbox, changed)
        if match is not None:
            # Grow the region a little: the change mask misses an object's soft, antialiased rim, and a rim
            # left behind with zero flow shows up as a ghost at the source.
            grown = cv2.dilate(comp.astype(np.uint8), np.ones((2 * grow + 1, 2 * grow + 1), np.uint8)) > 0
            seed[grown & np.isnan(seed[..., 0])] = match
    return seed


class FlowInterpolator:
    """Optical-flow frame interpolation of VFIformer's form, without learned weights.

    1. Bidirectional flow F_0->1, F_1->0 with OpenCV DIS on uint8 grayscale, computed on an upscaled copy
       (``flow_scale``; DIS matches 8x8 patches, and a 64 px render has objects only a few patches wide).
       DIS cannot follow a small textureless object that moves further than its own size (the typical
       CLEVR "move"), so inside changed regions we seed large displacements by matching: every connected
       region where the images differ is searched in the other image (masked SSD); a unique match that
       lands on a changed region sets the flow of that region (grown by ``seed_grow`` px), see
       :func:`seed_flow`. Colour / material / add / drop changes find no such match and keep DIS's flow.
    2. Flow to time t by forward splatting ("flow reversal"): a pixel x of I_0 is at x + t F_0->1(x) at time
       t and deposits F_t->0 = -t F_0->1(x) there (symmetrically for I_1). We use this rather than
       Super-SloMo's linear blend F_t->0 = -t(1-t) F_0->1 + t^2 F_1->0 because that blend reads the flows at
       the *target* position: for an object that moves further than its own size neither flow sees the
       object at its mid-point, and it fades out instead of moving. Collisions (moving foreground over
       static background) are resolved by softmax splatting with an importance that grows with motion
       magnitude (what moved is in front) and falls with the forward-backward error.
    3. Backward-warp both images with ``grid_sample`` (on the GPU when the inputs are there).
    4. Soft occlusion mask H from forward-backward consistency: each source pixel carries
       c = exp(-|F_0->1(x) + F_1->0(x + F_0->1(x))|^2 / sigma^2); the splatted coverage times mean c gives
       visibilities v_0, v_1 at time t, and H = (1 - t) v_0 / ((1 - t) v_0 + t v_1) (the temporally closer,
       consistently visible frame wins; where neither side lands, H = 1 - t, a cross-fade).
       I_t = H * warp(I_0, F_t->0) + (1 - H) * warp(I_1, F_t->1).

    Measured on synthetic moves (docs/procedures.md): see ``procap.procedure.quality``.

    Args:
        flow_scale: upscaling factor applied before DIS (1 = none); default: enough to give DIS a working
            image of about ``AUTO_FLOW_SIDE`` px (2x for 64 px renders, none from 96 px up).
        preset: DIS preset, one of ``"ultrafast"``, ``"fast"``, ``"medium"``.
        fb_sigma: forward-backward error (pixels) at which a pixel's confidence is e^-1.
        motion_prior: softmax-splatting importance per pixel of motion (1/px).
        seed_matches: seed large displacements from matched change regions.
        change_threshold: per-pixel max-channel difference that counts as "changed" for the seeding.
        seed_grow: pixels by which a matched region is grown (antialiased rims).
        device: where the warping runs; default: the inputs' device.
    """

    _PRESETS: ClassVar[dict[str, int]] = {
        "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
        "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
        "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
    }

    def __init__(
        self,
        flow_scale: float | None = None,
        preset: str = "medium",
        fb_sigma: float = 1.0,
        motion_prior: float = 1.0,
        seed_matches: bool = True,
        change_threshold: float = 0.08,
        seed_grow: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        if preset not in self._PRESETS:
            raise ValueError(f"unknown DIS preset {preset!r}; choose one of {sorted(self._PRESETS)}")
        if flow_scale is not None and flow_scale <= 0:
            raise ValueError(f"flow_scale must be positive, got {flow_scale}")
        self.flow_scale = float(flow_scale) if flow_scale is not None else None
        self.preset = preset
        self.fb_sigma = float(fb_sigma)
        self.motion_prior = float(motion_prior)
        self.visibility_floor = 0.1
        self.seed_matches = bool(seed_matches)
        self.seed_grow = int(seed_grow)
        self.change_threshold = float(change_threshold)
        self.device = torch.device(device) if device is not None else None
        self._dis = None  # created lazily: cv2 objects do not pickle (multiprocessing workers)

    AUTO_FLOW_SIDE = 128

    def scale_for(self, height: int, width: int) -> float:
        """The upscaling factor used for images of this size."""
        if self.flow_scale is not None:
            return self.flow_scale
        return float(max(1, round(self.AUTO_FLOW_SIDE / max(height, width))))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_dis"] = None
        return state

    def _flow_engine(self):
        if self._dis is None:
            self._dis = cv2.DISOpticalFlow_create(self._PRESETS[self.preset])
        return self._dis

    def flow(self, before: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bidirectional flow at the images' own resolution (DIS, seeded by change-region matches).

        Args:
            before, after: (B, 3, H, W) float in [0, 1].

        Returns:
            ``(F_0->1, F_1->0)``, each (B, 2, H, W) float32 on CPU, in pixels of the input resolution.
        """
        _check_pair(before, after)
        rgb0, rgb1 = _to_rgb_f32(before), _to_rgb_f32(after)
        scale = self.scale_for(*before.shape[-2:])
        gray0, gray1 = _to_gray_u8(before, scale), _to_gray_u8(after, scale)
        fwd, bwd = [], []
        for a, b, g0, g1 in zip(rgb0, rgb1, gray0, gray1):
            fwd.append(self._one_flow(a, b, g0, g1))
            bwd.append(self._one_flow(b, a, g1, g0))
        return torch.from_numpy(np.stack(fwd)), torch.from_numpy(np.stack(bwd))

    def _one_flow(self, a: np.ndarray, b: np.ndarray, ga: np.ndarray, gb: np.ndarray) -> np.ndarray:
        """Flow a -> b, (2, H, W): DIS, overridden by the large-displacement seeds where there are any."""
        h, w = a.shape[:2]
        flow = self._downscale(self._flow_engine().calc(ga, gb, None), h, w, ga.shape[0] / h)
        if self.seed_matches:
            # The matched translation replaces DIS inside matched change regions: DIS cannot follow a small,
            # textureless object further than its own size, and (tried) starting DIS from the seeds smears
            # the seed into the surrounding background, which then drifts with the object.
            seed = seed_flow(a, b, self.change_threshold, grow=self.seed_grow)
            seeded = ~np.isnan(seed[..., 0])
            flow[:, seeded] = seed[seeded].T
        return flow

    @staticmethod
    def _downscale(flow: np.ndarray, h: int, w: int, scale: float) -> np.ndarray:
        """(h*s, w*s, 2) flow -> (2, h, w) flow in original pixels (area average, then divide by s)."""
        if scale != 1.0:
            flow = cv2.resize(flow, (w, h), interpolation=cv2.INTER_AREA) / scale
        return np.ascontiguousarray(flow.transpose(2, 0, 1), dtype=np.float32)

    def __call__(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        return self.at(before, after, 0.5)

    def at(self, before: torch.Tensor, after: torch.Tensor, t: float) -> torch.Tensor:
        """The frame at time ``t`` in (0, 1) between ``before`` (t=0) and ``after`` (t=1).

        Args:
            before, after: (B, 3, H, W) float in [0, 1].
            t: time in [0, 1].

        Returns:
            (B, 3, H, W) float32 in [0, 1] on the inputs' device (or ``device``).
        """
        _check_pair(before, after)
        device = self.device or before.device
        if device.type == "cpu" and torch.get_num_threads() > 1:
            # Small element-wise ops: intra-op threads cost more than they give (10x slower on busy cores).
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return self._at(before, after, t, device)
            finally:
                torch.set_num_threads(threads)
        return self._at(before, after, t, device)

    def frames_at(self, before: torch.Tensor, after: torch.Tensor, times: list[float]) -> torch.Tensor:
        """Frames at several times from one bidirectional flow (``direct`` procedures).

        Args:
            before, after: (B, 3, H, W) float in [0, 1].
            times: times in [0, 1].

        Returns:
            (B, len(times), 3, H, W).
        """
        _check_pair(before, after)
        device = self.device or before.device
        threads = torch.get_num_threads()
        if device.type == "cpu":
            torch.set_num_threads(1)  # see at()
        try:
            flows = [f.to(device) for f in self.flow(before, after)]
            return torch.stack([self._at(before, after, t, device, flows) for t in times], dim=1)
        finally:
            torch.set_num_threads(threads)

    def _at(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        t: float,
        device: torch.device,
        flows: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        f01, f10 = flows if flows is not None else (f.to(device) for f in self.flow(before, after))
        i0, i1 = before.to(device).float(), after.to(device).float()
        ft0, ft1, v0, v1 = self._flows_to_time(f01, f10, t)
        w0, w1 = (1.0 - t) * v0, t * v1
        both_missing = (w0 + w1) < 1e-6
        # Where neither side has a consistent source (rare), fall back to a cross-fade: H = 1 - t.
        h_mask = torch.where(both_missing, torch.full_like(w0, 1.0 - t), w0 / (w0 + w1).clamp_min(1e-6))
        out = h_mask * backward_warp(i0, ft0) + (1.0 - h_mask) * backward_warp(i1, ft1)
        return out.clamp(0.0, 1.0)

    def _confidence(self, f_ab: torch.Tensor, f_ba: torch.Tensor) -> torch.Tensor:
        """Forward-backward consistency of F_a->b: (B, 1, H, W) in (0, 1]."""
        err = f_ab + backward_warp(f_ba, f_ab)
        return torch.exp(-(err * err).sum(1, keepdim=True) / self.fb_sigma**2)

    def _splat_side(self, f_ab: torch.Tensor, f_ba: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Splat F_a->b from frame a to time ``tau`` (fraction of the way to b).

        Returns:
            ``(flow_to_a (B,2,H,W), visibility (B,1,H,W))``: the backward flow from time tau to frame a and
            how much consistent mass of frame a landed on each pixel (clamped to [0, 1]).
        """
        conf = self._confidence(f_ab, f_ba)
        magnitude = f_ab.norm(dim=1, keepdim=True).clamp(max=30.0)  # cap keeps exp() finite in fp32
        importance = conf * torch.exp(self.motion_prior * magnitude)
        sums, weight = forward_splat(f_ab, tau * f_ab, importance)
        mean_flow = sums / weight.clamp_min(1e-8)
        # Visibility: coverage times mean confidence, independent of the motion prior's scale. The floor keeps
        # inconsistent-but-present content (e.g. background about to be covered) ahead of no content at all.
        conf_sum, cover = forward_splat(conf, tau * f_ab, torch.ones_like(conf))
        mean_conf = conf_sum / cover.clamp_min(1e-8)
        visibility = cover.clamp(max=1.0) * (self.visibility_floor + (1.0 - self.visibility_floor) * mean_conf)
        flow_to_a = torch.where(weight > 1e-8, -tau * mean_flow, torch.zeros_like(mean_flow))
        return flow_to_a, visibility.clamp(0.0, 1.0)

    def _flows_to_time(
        self, f01: torch.Tensor, f10: torch.Tensor, t: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Backward flows F_t->0, F_t->1 and visibilities v0, v1 at time t (see class docstring)."""
        ft0, v0 = self._splat_side(f01, f10, t)
        ft1, v1 = self._splat_side(f10, f01, 1.0 - t)
        return ft0, ft1, v0, v1


def _check_pair(before: torch.Tensor, after: torch.Tensor) -> None:
    if before.dim() != 4 or before.shape[1] != 3:
        raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(before.shape)}")
    if before.shape != after.shape:
        raise ValueError(
            f"before and after must have the same shape, got {tuple(before.shape)} and {tuple(after.shape)}"
        )


def levels_for(num_generated: int) -> int:
    """Recursion depth m for l = 2**m - 1 frames; ValueError for anything but 3, 7, 15."""
    if num_generated not in GENERATED_FRAME_COUNTS:
        raise ValueError(
            f"l (generated frames) must be one of {GENERATED_FRAME_COUNTS} (l = 2^m - 1), got {num_generated}"
        )
    return int(np.log2(num_generated + 1))


@torch.no_grad()
def generate_procedure(
    before: torch.Tensor, after: torch.Tensor, interpolator: Interpolator, num_generated: int = 7, direct: bool = False
) -> torch.Tensor:
    """Synthesize ``l = num_generated`` intermediate frames by recursive midpoints (the paper's procedure).

    Level 1 interpolates (I_bef, I_aft); each further level inserts a midpoint between every adjacent
    pair, all pairs of a level in one batched call (so l = 7 costs three calls of batch B, 2B, 4B).
    With ``direct=True`` and an interpolator that has ``frames_at`` (:class:`FlowInterpolator`), the frames
    at t = i / (l + 1) are instead rendered from the one flow between before and after: l times fewer flow
    computations, and no error compounding through synthesized frames.

    Args:
        before, after: (3, H, W) or (B, 3, H, W) float in [0, 1].
        interpolator: an :class:`Interpolator`.
        num_generated: l in {3, 7, 15}.
        direct: render all times from the endpoints' flow (needs ``interpolator.frames_at``).

    Returns:
        (l, 3, H, W) or (B, l, 3, H, W), intermediates only, in temporal order.
    """
    levels = levels_for(num_generated)
    unbatched = before.dim() == 3
    if unbatched:
        before, after = before.unsqueeze(0), after.unsqueeze(0)
    _check_pair(before, after)
    if direct:
        out = _frames_at_times(before, after, interpolator, num_generated)
    else:
        out = _recursive_midpoints(before, after, interpolator, levels)
    return out[0] if unbatched else out


def _frames_at_times(
    before: torch.Tensor, after: torch.Tensor, interpolator: Interpolator, num_generated: int
) -> torch.Tensor:
    """(B, l, 3, H, W): the frames at t = i / (l + 1), all rendered from the one flow between (B, 3, H, W) endpoints."""
    if not hasattr(interpolator, "frames_at"):
        raise ValueError(
            f"direct procedures need an interpolator with frames_at(); {type(interpolator).__name__} "
            f"only gives midpoints"
        )
    times = [i / (num_generated + 1) for i in range(1, num_generated + 1)]
    return interpolator.frames_at(before.float(), after.float(), times).to(before.device).float()


def _recursive_midpoints(
    before: torch.Tensor, after: torch.Tensor, interpolator: Interpolator, levels: int
) -> torch.Tensor:
    """(B, 2^levels - 1, 3, H, W): ``levels`` rounds of a midpoint between every adjacent pair, one call a round."""
    frames = [before.float(), after.float()]
    for _ in range(levels):
        left = torch.cat(frames[:-1], dim=0)
        right = torch.cat(frames[1:], dim=0)
        mids = interpolator(left, right).to(before.device).float().chunk(len(frames) - 1, dim=0)
        merged = [frames[0]]
        for mid, nxt in zip(mids, frames[1:]):
            merged += [mid, nxt]
        frames = merged
    return torch.stack(frames[1:-1], dim=1)
