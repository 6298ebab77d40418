"""Fast inference: ``Captioner`` (bf16, static KV cache, CUDA-graph decoding). See docs/fast.md.

``Captioner`` needs torch and the model; it is imported on first use, so that ``procap caption --out`` checks its
output file (:mod:`procap.fast.caption_file`) before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procap.fast.captioner import Captioner


def __getattr__(name: str) -> Any:
    if name == "Captioner":
        from procap.fast.captioner import Captioner  # torch: only when the Captioner is asked for

        return Captioner
    raise AttributeError(f"module 'procap.fast' has no attribute {name!r}")


__all__ = ["Captioner"]
