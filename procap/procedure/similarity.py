"""Frame similarity functions for the confidence score: ``s(I_bef, P)`` and ``s(I_aft, P)``.

All share one interface, :class:`Similarity`: called with the l + 2 frames of a procedure (before, the
l intermediates, after) it returns the similarity of every frame to the first and to the last frame.

- :class:`VQGANSimilarity` (default, no extra weights): cosine similarity of mean-pooled features of the
  frozen VQGAN encoder (``VQGAN.features``), the same tokenizer the model uses.
- :class:`DINOv2Similarity`: cosine similarity of DINOv2 ViT-L/14 embeddings, through timm, from a weights
  file the user supplies (nothing is downloaded; timm is the optional ``dinov2`` extra).
- :class:`ScoreFileSimilarity`: the authors' precomputed CLIP4IDC score files
  ``{id: {"bef_inter_sim": [n_caps x 9], "inter_aft_sim": [n_caps x 9]}}`` (CLEVR nested under
  ``sc_sim_matrixes`` / ``nsc_sim_matrixes``), averaged over captions. Looked up by key, frames unused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from procap.core.errors import ProCapError
from procap.core.json_files import read_json

if TYPE_CHECKING:
    from procap.model.vqgan import VQGAN


@runtime_checkable
class Similarity(Protocol):
    """``(frames (T, 3, H, W) float [0, 1], key) -> (s_bef (T,), s_aft (T,))``.

    ``frames`` are [before, P_1..P_l, after]; ``key`` names the pair for look-up based similarities (a
    :class:`ScoreFileSimilarity` needs it, embedding similarities ignore it). ``frames`` may also be batched
    (B, T, 3, H, W), giving (B, T) outputs.
    """

    def __call__(self, frames: torch.Tensor, key: Any = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class EmbeddingSimilarity:
    """Cosine similarity of per-frame embeddings; subclasses implement :meth:`embed`."""

    batch_size = 32

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) float [0, 1] -> (N, D) embeddings."""
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, frames: torch.Tensor, key: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        unbatched = frames.dim() == 4
        if unbatched:
            frames = frames.unsqueeze(0)
        if frames.dim() != 5 or frames.shape[2] != 3 or frames.shape[1] < 2:
            raise ValueError(f"expected frames (T, 3, H, W) or (B, T, 3, H, W), got {tuple(frames.shape)}")
        b, t = frames.shape[:2]
        flat = frames.reshape(b * t, *frames.shape[2:])
        emb = torch.cat([self.embed(chunk) for chunk in flat.split(self.batch_size)]).float()
        emb = F.normalize(emb.reshape(b, t, -1), dim=-1)  # (B, T, D)
        s_bef = (emb * emb[:, :1]).sum(-1)
        s_aft = (emb * emb[:, -1:]).sum(-1)
        return (s_bef[0], s_aft[0]) if unbatched else (s_bef, s_aft)


class VQGANSimilarity(EmbeddingSimilarity):
    """Mean-pooled ``VQGAN.features`` (the pre-quant encoder output), cosine similarity.

    Args:
        vqgan: a :class:`procap.model.vqgan.VQGAN` (kept frozen, eval mode).
        device: where to run it (default: the module's device).
    """

    def __init__(self, vqgan: VQGAN, device: torch.device | str | None = None) -> None:
        self.vqgan = vqgan.eval().requires_grad_(False)
        self.device = torch.device(device) if device is not None else next(vqgan.parameters()).device
        self.vqgan.to(self.device)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        feats = self.vqgan.features(images.to(self.device).float())  # (N, C, h, w)
        return feats.mean(dim=(2, 3))


class DINOv2Similarity(EmbeddingSimilarity):
    """DINOv2 ViT-L/14 (timm ``vit_large_patch14_dinov2``) CLS embeddings, cosine similarity.

    Images are resized to ``image_size`` (a multiple of 14; positions are interpolated by timm's dynamic
    image size) and normalised with the ImageNet mean/std DINOv2 was trained with.

    Args:
        weights: a ``.safetensors`` or ``.pth`` state dict (timm's or Meta's original key names).
        image_size: input side in pixels.
        device: where to run the model.
        model_name: the timm architecture.
    """

    MEAN = (0.485, 0.456, 0.406)
    STD = (0.229, 0.224, 0.225)

    def __init__(
        self,
        weights: str | Path,
        image_size: int = 224,
        device: torch.device | str = "cpu",
        model_name: str = "vit_large_patch14_dinov2",
    ) -> None:
        if image_size % 14:
            raise ProCapError(f"the DINOv2 image size must be a multiple of 14, got {image_size}.")
        try:
            import timm
        except ImportError:
            raise ProCapError(
                "--similarity dinov2 needs timm, which is not installed; "
                "install the extra with `pip install procap[dinov2]`."
            ) from None
        weights = Path(weights)
        if not weights.is_file():
            raise ProCapError(f"DINOv2 weights file {weights} does not exist.")
        model = timm.create_model(model_name, pretrained=False, num_classes=0, dynamic_img_size=True)
        state = _read_state_dict(weights)
        try:
            from timm.models.vision_transformer import checkpoint_filter_fn

            state = checkpoint_filter_fn(state, model)  # maps Meta's original key names onto timm's
        except ImportError:
            pass
        missing, _unexpected = model.load_state_dict(state, strict=False)
        if missing:
            raise ProCapError(
                f"DINOv2 weights {weights} do not match {model_name}: {len(missing)} missing keys "
                f"(first: {', '.join(missing[:3])})."
            )
        self.model = model.eval().requires_grad_(False).to(device)
        self.device, self.image_size = torch.device(device), image_size
        self._mean = torch.tensor(self.MEAN, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(self.STD, device=self.device).view(1, 3, 1, 1)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(
            images.to(self.device).float(), size=(self.image_size, self.image_size), mode="bicubic", align_corners=False
        ).clamp(0, 1)
        return self.model((x - self._mean) / self._std)  # (N, 1024) pooled CLS with num_classes=0


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from safetensors or a torch file (``weights_only``: no pickled code runs)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-sentence error
        raise ProCapError(f"weights file {path} cannot be read as a state dict ({str(exc).splitlines()[0][:100]}).")
    for wrapper in ("model", "state_dict", "teacher"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return state


class ScoreFileSimilarity:
    """The authors' precomputed similarity file (CLIP4IDC image-text scores), averaged over captions.

    Keys are the authors' video ids (``"000123.png"`` for CLEVR, ``img_id`` for Spot-the-Diff, ``uid`` for
    Image-Editing-Request). CLEVR entries hold ``sc_sim_matrixes`` and ``nsc_sim_matrixes``; the ``group``
    part of the key picks one.

    Call with ``key=(group, id)`` (group ``"sc"``/``"nsc"``/``None``) or ``key=id``.
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self.scores = read_json(path, "score file")
        if not isinstance(self.scores, dict):
            raise ProCapError(f"score file {path} must hold a JSON object keyed by image id.")
        self.path = path

    def __contains__(self, key: Any) -> bool:
        _group, vid = _split_key(key)
        return vid in self.scores

    def __call__(self, frames: torch.Tensor | None = None, key: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        group, vid = _split_key(key)
        entry = self.scores.get(vid)
        if entry is None:
            raise ProCapError(f"score file {self.path} has no entry for {vid!r}.")
        if "bef_inter_sim" not in entry:
            nested = f"{group}_sim_matrixes" if group else None
            if nested not in entry:
                raise ProCapError(
                    f"score file {self.path}: entry {vid!r} has neither bef_inter_sim nor "
                    f"{nested or 'a group (sc/nsc) to look under'}."
                )
            entry = entry[nested]
        s_bef = torch.tensor(entry["bef_inter_sim"], dtype=torch.float32)
        s_aft = torch.tensor(entry["inter_aft_sim"], dtype=torch.float32)
        if s_bef.dim() == 2:  # (n_caps, T): average over captions, as the authors do
            s_bef, s_aft = s_bef.mean(0), s_aft.mean(0)
        if frames is not None and s_bef.shape[0] != frames.shape[-4]:
            raise ProCapError(
                f"score file {self.path}: entry {vid!r} has {s_bef.shape[0]} scores per caption "
                f"but the procedure has {frames.shape[-4]} frames."
            )
        return s_bef, s_aft


def _split_key(key: Any) -> tuple[str | None, str]:
    if isinstance(key, tuple):
        return key[0], str(key[1])
    return None, str(key)
