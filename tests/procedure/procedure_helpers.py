"""Helpers for the procedure tests: tiny synthetic images (no dataset generator needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

SIZE = 32


def square_image(cx: float, cy: float, size: int = SIZE, half: int = 4) -> torch.Tensor:
    """(3, size, size) grey background with a red square centred at (cx, cy)."""
    img = torch.full((3, size, size), 0.5)
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    inside = ((xs - cx).abs() <= half) & ((ys - cy).abs() <= half)
    for c, v in enumerate((0.9, 0.15, 0.1)):
        img[c][inside] = v
    return img


def textured(shift_x: int, shift_y: int, size: int = 48) -> torch.Tensor:
    """A smooth multi-scale random texture seen through a window moved by (shift_x, shift_y) pixels."""
    gen = torch.Generator().manual_seed(0)
    octaves = [
        weight
        * torch.nn.functional.interpolate(
            torch.rand(1, 3, cells, cells, generator=gen), size=(80, 80), mode="bicubic", align_corners=False
        )
        for cells, weight in ((4, 0.5), (8, 0.3), (16, 0.2))
    ]
    big = sum(octaves).clamp(0, 1)[0]
    return big[:, 12 + shift_y : 12 + shift_y + size, 12 + shift_x : 12 + shift_x + size].contiguous()


def save_png(image: torch.Tensor, path: Path) -> None:
    arr = (image.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(np.ascontiguousarray(arr)).save(path)
