"""Pseudo-3D rasteriser for the synthetic CLEVR-like benchmark (numpy only).

A scene is drawn on a supersampled canvas and box-filtered down to the output size, which gives
antialiased edges without any dependency beyond numpy. Every drawable is described by a `DrawItem`
whose appearance is *linear* in the quantities a change interpolates (colour, metalness, opacity,
position), so a change's intermediate state at t = 0 / t = 1 reproduces the before / after image bit
for bit (the generator renders those images through the same code path).

Coordinates: scene x, y in [0, 1] (x to the right, y towards the viewer); the view maps them to the
canvas with a small shift / zoom, which is how distractor images get their viewpoint change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# CLEVR's own RGB values (properties.json of the CLEVR generator), in [0, 1].
COLORS: dict[str, tuple[float, float, float]] = {
    "gray": (87 / 255, 87 / 255, 87 / 255),
    "red": (173 / 255, 35 / 255, 35 / 255),
    "blue": (42 / 255, 75 / 255, 215 / 255),
    "green": (29 / 255, 105 / 255, 20 / 255),
    "brown": (129 / 255, 74 / 255, 25 / 255),
    "purple": (129 / 255, 38 / 255, 192 / 255),
    "cyan": (41 / 255, 208 / 255, 208 / 255),
    "yellow": (255 / 255, 238 / 255, 51 / 255),
}
SHAPES = ("cube", "sphere", "cylinder")
SIZES = {"small": 0.085, "large": 0.13}  # object "radius" as a fraction of the image side
MATERIALS = ("rubber", "metal")


@dataclass
class View:
    """Camera and light: a distractor changes these and nothing else."""

    dx: float = 0.0  # canvas shift, fraction of the image side
    dy: float = 0.0
    scale: float = 1.0  # zoom about the image centre
    light: float = -2.3  # light azimuth in radians (default: from the upper left)
    brightness: float = 1.0


@dataclass
class DrawItem:
    """One object as the rasteriser sees it (already blended for an intermediate state)."""

    shape: str
    rgb: np.ndarray  # (3,) float in [0, 1]
    radius: float  # fraction of the image side, before perspective
    metal: float  # 0 = rubber, 1 = metal; in between blends the two shadings linearly
    x: float
    y: float
    alpha: float = 1.0  # opacity, used by add / drop fades


def supersampling(size: int) -> int:
    """Supersampling factor: about 256 px of canvas for small outputs, at least 2x for large ones."""
    return max(2, math.ceil(256 / size))


def _light_vector(view: View) -> np.ndarray:
    lx, ly = math.cos(view.light), math.sin(view.light)
    v = np.array([0.6 * lx, 0.6 * ly, 0.8])
    return v / np.linalg.norm(v)


def _background(canvas: int, view: View) -> np.ndarray:
    """CLEVR-like grey floor: darker towards the horizon, a soft light fall-off. (canvas, canvas, 3)."""
    ramp = np.linspace(0.0, 1.0, canvas)
    vertical = 0.40 + 0.14 * ramp[:, None]
    lx, ly = math.cos(view.light), math.sin(view.light)
    # Brighter on the side the light comes from.
    side = 0.04 * (-(lx * (ramp[None, :] - 0.5)) - ly * (ramp[:, None] - 0.5))
    floor = (vertical + side) * view.brightness
    return np.repeat(floor[:, :, None], 3, axis=2)


def _screen(item: DrawItem, view: View, canvas: int) -> tuple[float, float, float]:
    """Centre (u, v) and radius r of an item in canvas pixels; nearer objects look a bit larger."""
    u = (0.5 + (item.x - 0.5) * view.scale + view.dx) * canvas
    v = (0.5 + (item.y - 0.5) * view.scale + view.dy) * canvas
    r = item.radius * view.scale * (0.85 + 0.3 * item.y) * canvas
    return u, v, r


def _window(u: float, v: float, r: float, canvas: int, pad: float = 1.6) -> tuple[slice, slice, np.ndarray, np.ndarray]:
    """Pixel window around an item and the pixel-centre coordinates inside it."""
    y0, y1 = max(0, int(v - pad * r)), min(canvas, int(v + pad * r) + 2)
    x0, x1 = max(0, int(u - pad * r)), min(canvas, int(u + pad * r) + 2)
    ys = np.arange(y0, y1, dtype=np.float64)[:, None] + 0.5
    xs = np.arange(x0, x1, dtype=np.float64)[None, :] + 0.5
    return slice(y0, y1), slice(x0, x1), xs, ys


def _shade(rgb: np.ndarray, diffuse: np.ndarray, spec: np.ndarray, metal: float, view: View) -> np.ndarray:
    """Blend of matte (rubber) and shiny (metal) shading; linear in `metal` and `rgb`. Returns (h, w, 3)."""
    d = diffuse[..., None]
    matte = rgb * (0.45 + 0.6 * d)
    # Metal: stronger contrast, darker body, a white specular highlight.
    shiny = rgb * (0.2 + 0.75 * d * d) + 0.9 * spec[..., None]
    return ((1.0 - metal) * matte + metal * shiny) * view.brightness


def _sphere(item: DrawItem, xs, ys, u, v, r, light, view) -> tuple[np.ndarray, np.ndarray]:
    nx, ny = (xs - u) / r, (ys - v) / r
    d2 = nx * nx + ny * ny
    mask = d2 <= 1.0
    nz = np.sqrt(np.clip(1.0 - d2, 0.0, 1.0))
    diffuse = np.clip(nx * light[0] + ny * light[1] + nz * light[2], 0.0, 1.0)
    half = light + np.array([0.0, 0.0, 1.0])
    half = half / np.linalg.norm(half)
    spec = np.clip(nx * half[0] + ny * half[1] + nz * half[2], 0.0, 1.0) ** 40
    return mask, _shade(item.rgb, diffuse, spec, item.metal, view)


def _cube(item: DrawItem, xs, ys, u, v, r, light, view) -> tuple[np.ndarray, np.ndarray]:
    a, o = 0.78 * r, 0.42 * r  # half side of the front face, oblique depth offset
    left, right, top, bottom = u - a - o / 2, u + a - o / 2, v - a + o / 2, v + a + o / 2
    front = (xs >= left) & (xs <= right) & (ys >= top) & (ys <= bottom)
    k_top = (top - ys) / o  # 0 at the front edge, 1 at the back edge
    top_face = (k_top >= 0) & (k_top <= 1) & (xs - k_top * o >= left) & (xs - k_top * o <= right)
    k_side = (xs - right) / o
    side_face = (k_side >= 0) & (k_side <= 1) & (ys + k_side * o >= top) & (ys + k_side * o <= bottom)
    # Face normals: front faces the viewer, top faces up (-y on screen), side faces right (+x).
    lit = {"front": light[2], "top": 0.55 + 0.45 * max(0.0, -light[1]), "side": 0.35 * max(0.0, light[0]) + 0.15}
    diffuse = np.where(front, lit["front"], np.where(top_face, lit["top"] + 0.25, lit["side"]))
    # Metal highlight: a soft diagonal streak across the front face.
    t = ((xs - left) + (ys - top)) / (4 * a)
    spec = np.where(front, np.exp(-((t - 0.35) ** 2) / 0.004), np.where(top_face, 0.35, 0.0))
    diffuse = np.broadcast_to(diffuse, front.shape)
    spec = np.broadcast_to(spec, front.shape)
    mask = front | top_face | side_face
    return mask, _shade(item.rgb, diffuse, spec, item.metal, view)


def _cylinder(item: DrawItem, xs, ys, u, v, r, light, view) -> tuple[np.ndarray, np.ndarray]:
    a, e = 0.8 * r, 0.3 * r  # half width, vertical radius of the elliptical caps
    top, bottom = v - 0.8 * r, v + 0.8 * r
    nx = np.clip((xs - u) / a, -1.0, 1.0)
    inside_x = np.abs(xs - u) <= a
    body = inside_x & (ys >= top) & (ys <= bottom)
    bottom_cap = ((xs - u) / a) ** 2 + ((ys - bottom) / e) ** 2 <= 1.0
    top_cap = ((xs - u) / a) ** 2 + ((ys - top) / e) ** 2 <= 1.0
    nz = np.sqrt(1.0 - nx * nx)
    body_diffuse = np.clip(nx * light[0] + nz * light[2], 0.0, 1.0)
    half_x = light[0] / np.linalg.norm(light + np.array([0.0, 0.0, 1.0]))
    body_spec = np.exp(-((nx - half_x) ** 2) / 0.01)  # a vertical highlight stripe
    cap_diffuse = 0.8 + 0.2 * max(0.0, -light[1])
    diffuse = np.where(top_cap, cap_diffuse, np.broadcast_to(body_diffuse, top_cap.shape))
    spec = np.where(top_cap, 0.25, np.broadcast_to(body_spec, top_cap.shape))
    mask = body | bottom_cap | top_cap
    return mask, _shade(item.rgb, diffuse, spec, item.metal, view)


_DRAW = {"sphere": _sphere, "cube": _cube, "cylinder": _cylinder}


def _shadow(img: np.ndarray, item: DrawItem, view: View, canvas: int) -> None:
    """Soft elliptical contact shadow, cast away from the light, scaled by the item's opacity."""
    u, v, r = _screen(item, view, canvas)
    su, sv = u - 0.35 * r * math.cos(view.light), v + 0.75 * r
    ys_sl, xs_sl, xs, ys = _window(su, sv, r, canvas, pad=1.3)
    d2 = ((xs - su) / (1.15 * r)) ** 2 + ((ys - sv) / (0.45 * r)) ** 2
    factor = 1.0 - 0.35 * item.alpha * np.clip(1.0 - d2, 0.0, 1.0)
    img[ys_sl, xs_sl] *= factor[..., None]


def render_items(items: list[DrawItem], view: View, size: int) -> np.ndarray:
    """Rasterise items (drawn back to front) into an antialiased uint8 image (size, size, 3)."""
    ss = supersampling(size)
    canvas = size * ss
    img = _background(canvas, view)
    light = _light_vector(view)
    visible = sorted((it for it in items if it.alpha > 0.0), key=lambda it: it.y)
    for item in visible:
        _shadow(img, item, view, canvas)
    for item in visible:
        u, v, r = _screen(item, view, canvas)
        ys_sl, xs_sl, xs, ys = _window(u, v, r, canvas)
        mask, color = _DRAW[item.shape](item, xs, ys, u, v, r, light, view)
        a = item.alpha * mask[..., None]
        patch = img[ys_sl, xs_sl]
        img[ys_sl, xs_sl] = patch * (1.0 - a) + np.clip(color, 0.0, 1.0) * a
    # Box filter = exact area average of the supersampled canvas.
    small = img.reshape(size, ss, size, ss, 3).mean(axis=(1, 3))
    return np.round(np.clip(small, 0.0, 1.0) * 255.0).astype(np.uint8)
