"""Interpolation quality against the synthetic generator's ground truth.

The synthetic benchmark can render the true state of a change at any time t
(``procap.data.synthetic.render_intermediate``). For "move" pairs the true midpoint has the object half-way,
which a cross-fade cannot produce (it shows two half-transparent copies). We report PSNR of each
interpolator's midpoint against the truth, over the whole image and over the changed region only (pixels
where before, after or the truth differ), since a small object is a small part of the image.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from procap.core.json_files import read_json
from procap.data.synthetic import render_intermediate
from procap.procedure.interpolate import CrossFade, FlowInterpolator, Interpolator, generate_procedure


def psnr(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-image PSNR in dB of [0, 1] images (B, 3, H, W); ``mask`` (B, 1, H, W) restricts the pixels."""
    err = (x.float() - y.float()) ** 2
    if mask is None:
        mse = err.flatten(1).mean(1)
    else:
        m = mask.float().expand_as(err)
        mse = (err * m).flatten(1).sum(1) / m.flatten(1).sum(1).clamp_min(1.0)
    return 10.0 * torch.log10(1.0 / mse.clamp_min(1e-10))


def load_truth(
    root: str | Path, change_type: str = "move", limit: int | None = None, t: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(before, after, truth at t) as (N, 3, H, W) float for the scenes of one change type."""
    scenes = read_json(Path(root) / "scenes.json", "synthetic scenes file")["scenes"]
    ids = [s["index"] for s in scenes if s["change"]["type"] == change_type][:limit]
    if not ids:
        raise ValueError(f"no {change_type!r} scenes in {root}")

    def stack(time_: float) -> torch.Tensor:
        arrays = [render_intermediate(root, i, time_) for i in ids]
        return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0

    return stack(0.0), stack(1.0), stack(t)


def evaluate_interpolators(
    root: str | Path,
    interpolators: dict[str, Interpolator] | None = None,
    change_type: str = "move",
    limit: int | None = None,
    batch_size: int = 16,
) -> dict[str, dict[str, Any]]:
    """PSNR of each interpolator's midpoint against the rendered truth at t = 0.5.

    Args:
        root: a directory written by ``procap synth`` (needs ``scenes.json``).
        interpolators: name -> interpolator (default: ``flow`` and ``crossfade``).
        change_type: which scenes (``move`` is where motion matters).
        limit: at most this many scenes.
        batch_size: pairs per interpolator call.

    Returns:
        ``{name: {"psnr": mean dB, "psnr_changed": mean dB over changed pixels, "pairs": n,
        "ms_per_pair": float}}``.
    """
    interpolators = interpolators or {"flow": FlowInterpolator(), "crossfade": CrossFade()}
    before, after, truth = load_truth(root, change_type, limit)
    changed = ((before - after).abs().amax(1, keepdim=True) > 0.02) | (
        (before - truth).abs().amax(1, keepdim=True) > 0.02
    )
    results = {}
    for name, interp in interpolators.items():
        start = time.perf_counter()
        mids = torch.cat([interp(b, a).cpu() for b, a in zip(before.split(batch_size), after.split(batch_size))])
        elapsed = time.perf_counter() - start
        results[name] = {
            "psnr": float(psnr(mids, truth).mean()),
            "psnr_changed": float(psnr(mids, truth, changed).mean()),
            "pairs": int(before.shape[0]),
            "ms_per_pair": 1000.0 * elapsed / before.shape[0],
        }
    return results


def evaluate_procedures(
    root: str | Path,
    num_generated: int = 7,
    change_type: str = "move",
    limit: int | None = None,
    interpolators: dict[str, Interpolator] | None = None,
) -> dict[str, dict[str, Any]]:
    """PSNR of whole procedures (all l frames at t = i / (l + 1)) against the rendered truth.

    Compares the paper's recursive midpoints with ``direct`` rendering from one flow, for every interpolator.

    Returns:
        ``{"<name>/<recursive|direct>": {"psnr": mean dB over frames and pairs, "per_frame": [dB] * l,
        "ms_per_pair": float}}``.
    """
    interpolators = interpolators or {"flow": FlowInterpolator(), "crossfade": CrossFade()}
    before, after, _ = load_truth(root, change_type, limit)
    times = [i / (num_generated + 1) for i in range(1, num_generated + 1)]
    truth = torch.stack([load_truth(root, change_type, limit, t)[2] for t in times], dim=1)  # (N, l, 3, H, W)
    results = {}
    for name, interp in interpolators.items():
        for mode in ("recursive", "direct"):
            if mode == "direct" and not hasattr(interp, "frames_at"):
                continue
            start = time.perf_counter()
            frames = generate_procedure(before, after, interp, num_generated, direct=mode == "direct").cpu()
            elapsed = time.perf_counter() - start
            per_frame = [float(psnr(frames[:, i], truth[:, i]).mean()) for i in range(num_generated)]
            results[f"{name}/{mode}"] = {
                "psnr": sum(per_frame) / num_generated,
                "per_frame": per_frame,
                "pairs": int(before.shape[0]),
                "ms_per_pair": 1000.0 * elapsed / before.shape[0],
            }
    return results
