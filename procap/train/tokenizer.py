"""The demo's tokenizer: a linear probe of what a VQGAN keeps of the changed object, and the embedded default.

**Probe.** For every change pair of the synthetic benchmark (``procap synth``), the VQGAN feature of the latent cell
under the changed object's centre (in the *before* image; the *after* image for ``add``) is read, and one linear
classifier per attribute (colour, shape, material, size) is fitted on the training split and scored on the test split.
The same is done on the raw pixels of that cell, the ceiling of what any tokenizer could keep there. A tokenizer
whose features lose the object's colour or shape leaves the captioner nothing to name it with.

**Embedded default.** ``procap demo`` starts from ``procap/assets/demo_tokenizer.safetensors`` (the ``tiny``
preset's f4 VQGAN, 16 x 16 latents at 64 px) instead of fitting a tokenizer every run; its metadata holds the exact
commands that reproduce it and the probe figures it was shipped with (:func:`embedded_tokenizer_info`).
``procap demo --train-tokenizer`` fits a new one instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from procap.assets import DEMO_TOKENIZER, demo_tokenizer_path
from procap.core.errors import ProCapError
from procap.core.json_files import read_json
from procap.data import load_split
from procap.data.images import load_image
from procap.data.synthetic import changed_object
from procap.model.vqgan import VQGAN

PROBE_ATTRIBUTES = ("color", "shape", "material", "size")
EMBEDDED_TOKENIZER = DEMO_TOKENIZER


def embedded_tokenizer_path() -> Path:
    """Path of the demo's embedded tokenizer inside the installed package."""
    return demo_tokenizer_path()


def embedded_tokenizer_info() -> dict[str, Any]:
    """The embedded tokenizer's ``extra`` metadata: ``commands`` (how it was made), ``steps``, ``probe`` figures."""
    _state, meta = VQGAN.read_saved(embedded_tokenizer_path())
    return meta.get("extra", {})


def _object_cells(root: Path, pairs: list, size: int, factor: int) -> tuple[list[str], list[tuple[int, int]], list]:
    """Image path, latent cell (row, col) and attributes of the changed object of every change pair."""
    scenes = read_json(root / "scenes.json", "synthetic scenes file")["scenes"]
    by_index = {int(s["index"]): s for s in scenes}
    paths, cells, objects = [], [], []
    latent = size // factor
    for pair in pairs:
        if pair.change_type in (None, "no_change"):
            continue
        scene = by_index[int(Path(str(pair.id)).stem.split("_")[-1])]
        obj = changed_object(scene)
        # an added object is read in the after image, drawn from the after view when the benchmark moves the camera
        view = scene.get("after_view", scene["view"]) if pair.change_type == "add" else scene["view"]
        # the renderer's mapping from scene coordinates to pixels (procap.data.render)
        u = (0.5 + (obj["x"] - 0.5) * view["scale"] + view["dx"]) * size
        v = (0.5 + (obj["y"] - 0.5) * view["scale"] + view["dy"]) * size
        row = min(latent - 1, max(0, int(v // factor)))
        col = min(latent - 1, max(0, int(u // factor)))
        paths.append(pair.after_path if pair.change_type == "add" else pair.before_path)
        cells.append((row, col))
        objects.append(obj)
    return paths, cells, objects


def _cell_vectors(
    vqgan: VQGAN, images: torch.Tensor, cells: list[tuple[int, int]], factor: int, batch: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features at the cells (N, z), pixels of the cells (N, 3 * factor^2))."""
    feats = []
    with torch.no_grad():
        for chunk in images.split(batch):
            feats.append(vqgan.features(chunk).float())
    features = torch.cat(feats)  # (N, z, h, w)
    rows = torch.tensor([r for r, _ in cells])
    cols = torch.tensor([c for _, c in cells])
    at_cell = features[torch.arange(len(cells)), :, rows, cols]
    patches = torch.stack(
        [
            img[:, r * factor : (r + 1) * factor, c * factor : (c + 1) * factor].flatten()
            for img, (r, c) in zip(images, cells)
        ]
    )
    return at_cell, patches


def _fit_linear(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, classes: int) -> torch.Tensor:
    """Multinomial logistic regression (standardised inputs, small L2), full-batch L-BFGS; test predictions."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    x, tx = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(x.shape[1], classes, generator=generator) * 0.01).requires_grad_(True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, train_y) + 1e-3 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return (tx @ weight + bias).argmax(1)


def probe_tokenizer(vqgan: VQGAN, root: str | Path, train_pairs: list, test_pairs: list) -> dict[str, Any]:
    """Linear-probe accuracy of the changed object's attributes at its latent cell, features and raw pixels.

    Args:
        vqgan: a :class:`procap.model.vqgan.VQGAN` (run in eval mode, on the CPU).
        root: a folder written by ``procap synth`` (``scenes.json`` and the images).
        train_pairs, test_pairs: pairs of that dataset; the probe fits on the first and scores on the second.

    Returns:
        ``{"features": {attribute: accuracy}, "pixels": {attribute: accuracy}, "train": n, "test": n,
        "cell": factor}`` with accuracies in [0, 1] on the test pairs' changed objects.

    Raises:
        ProCapError: ``root`` has no ``scenes.json`` (not a synthetic benchmark) or a split has no change pair.
    """
    root = Path(root)
    if not (root / "scenes.json").is_file():
        raise ProCapError(f"{root} has no scenes.json: the tokenizer probe needs a benchmark written by procap synth.")
    vqgan = vqgan.eval().cpu()
    size, factor = vqgan.config.resolution, vqgan.config.downsample_factor
    vectors: dict[str, dict[str, torch.Tensor]] = {}  # split -> {"features": (N, z), "pixels": (N, 3 * factor^2)}
    objects: dict[str, list[dict[str, Any]]] = {}  # split -> the changed object of each of its N pairs
    for name, pairs in (("train", train_pairs), ("test", test_pairs)):
        paths, cells, objects[name] = _object_cells(root, pairs, size, factor)
        if not paths:
            raise ProCapError(f"the {name} pairs hold no change pair to probe.")
        images = torch.stack([load_image(p, size) for p in paths])
        features, pixels = _cell_vectors(vqgan, images, cells, factor)
        vectors[name] = {"features": features, "pixels": pixels}
    result: dict[str, Any] = {"features": {}, "pixels": {}, "cell": factor}
    result["train"], result["test"] = len(objects["train"]), len(objects["test"])
    for attribute in PROBE_ATTRIBUTES:
        values = sorted({o[attribute] for part in objects.values() for o in part})
        labels = {name: torch.tensor([values.index(o[attribute]) for o in part]) for name, part in objects.items()}
        for key in ("features", "pixels"):
            predicted = _fit_linear(vectors["train"][key], labels["train"], vectors["test"][key], len(values))
            result[key][attribute] = float((predicted == labels["test"]).float().mean())
    return result


def format_probe(result: dict[str, Any]) -> str:
    """A two-row table of :func:`probe_tokenizer`'s accuracies in %."""
    head = f"{'':<10}" + "".join(f"{a:>10}" for a in PROBE_ATTRIBUTES)
    rows = [head]
    for key in ("features", "pixels"):
        rows.append(f"{key:<10}" + "".join(f"{100 * result[key][a]:>9.1f}%" for a in PROBE_ATTRIBUTES))
    rows.append(f"({result['test']} test objects, a linear probe at the changed object's {result['cell']} px cell)")
    return "\n".join(rows)


def probe_mean(result: dict[str, Any], key: str = "features") -> float:
    """Mean probe accuracy over the attributes."""
    return float(np.mean([result[key][a] for a in PROBE_ATTRIBUTES]))


def ship_tokenizer(trained: str | Path, out: str | Path, data: str | Path, commands: list[str]) -> dict[str, Any]:
    """Write ``trained`` as the demo's embedded tokenizer: half-precision weights, the commands and the probe.

    The probe is measured on the half-precision weights that are shipped (test split of ``data``), so
    :func:`probe_tokenizer` on the shipped file reproduces the recorded figures.

    Args:
        trained: a VQGAN file written by ``procap vqgan``.
        out: the file to write (``procap/assets/demo_tokenizer.safetensors`` in a checkout).
        data: the synthetic benchmark it was trained on (``procap synth`` output).
        commands: the exact commands that made ``trained``, recorded in the metadata.

    Returns:
        The metadata's ``extra``: ``commands``, ``steps`` and ``probe``.
    """
    vqgan = VQGAN.load(trained)
    _state, meta = VQGAN.read_saved(trained)
    # half precision halves the file; the probe below is taken on exactly these rounded weights
    vqgan = vqgan.half().float()
    splits = {s: load_split("clevr-change", data, s) for s in ("train", "test")}
    probe = probe_tokenizer(vqgan, data, splits["train"], splits["test"])
    steps = meta.get("extra", {}).get("steps")
    extra = {"commands": list(commands), "steps": steps, "probe": probe}
    vqgan.half().save(out, extra)
    return extra


def _main(argv: list[str] | None = None) -> int:
    """``python -m procap.train.tokenizer probe|ship``: see tools/make_demo_tokenizer.sh."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m procap.train.tokenizer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    probe = sub.add_parser("probe", help="linear-probe a VQGAN (default: the embedded one) on a synthetic benchmark")
    probe.add_argument("--data", required=True, help="folder written by procap synth")
    probe.add_argument("--vqgan", default=None, help="VQGAN file (default: the embedded demo tokenizer)")
    ship = sub.add_parser("ship", help="write a trained VQGAN as the embedded demo tokenizer")
    ship.add_argument("--vqgan", required=True, help="VQGAN file written by procap vqgan")
    ship.add_argument("--data", required=True, help="the benchmark it was trained on")
    ship.add_argument("--out", default=str(embedded_tokenizer_path()), help="output file")
    ship.add_argument("--command", action="append", default=[], help="a command that made it (repeatable)")
    args = parser.parse_args(argv)
    if args.action == "probe":
        vqgan = VQGAN.load(args.vqgan or embedded_tokenizer_path())
        splits = {s: load_split("clevr-change", args.data, s) for s in ("train", "test")}
        print(format_probe(probe_tokenizer(vqgan, args.data, splits["train"], splits["test"])))
    else:
        extra = ship_tokenizer(args.vqgan, args.out, args.data, args.command)
        print(format_probe(extra["probe"]))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
