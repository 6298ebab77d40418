"""The FP8 agreement gate measured on a trained checkpoint: FP8 captions against bf16 ones (issue 52, item 4).

    python bench/fp8_agreement.py --checkpoint best.safetensors --data ROOT --split test --out fp8.json
    python bench/fp8_agreement.py ... --device cpu --configure-as cuda   # fake-quant FP8 on a CPU

On a GPU with FP8 (compute capability 8.9 or newer) the FP8 GEMMs run ``torch._scaled_mm``; on a CPU the fake-quant
reference of ``procap.kernels.fp8`` (the same quantised values, fp32 accumulation), so a CPU run measures what FP8
quantisation does to the captions, not its speed. Both runs use the same Captioner options (bf16 in the CUDA
configuration). Reported:

- the gate (``procap.fast.agreement``): caption / token agreement of FP8 against bf16, for the FP8 encoder GEMMs
  and for those plus the FP8 cross-attention cache, and whether each passes the 97 % gate;
- the decoder memory's ``||m - m_fp32|| / ||m_fp32||`` against the fp32 model (``ProCap.memory``), bf16 and FP8;
- the CLEVR correctness (change / type / object, ``procap.eval.correctness``) of the fp32 oracle, bf16 and FP8
  captions, and the paired bootstrap interval of FP8 minus bf16 for each figure (``procap.eval.paired``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from procap.data.datasets import load_split
from procap.data.images import load_image
from procap.eval.correctness import caption_accuracy, scene_truths
from procap.eval.paired import PAIRED_FIGURES, paired_difference
from procap.fast import Captioner
from procap.fast.agreement import GATE_MINIMUM, fp8_agreement
from procap.loading.checkpoint import load_checkpoint

CHUNK = 64
FIGURES = ("change", "type", "object", "distinct")


def relative_difference(value: torch.Tensor, reference: torch.Tensor) -> float:
    """``||value - reference|| / ||reference||`` in fp64."""
    value, reference = value.double(), reference.double()
    return float((value - reference).norm() / reference.norm().clamp_min(1e-30))


def _chunked(fn: Any, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(before[i : i + CHUNK], after[i : i + CHUNK]).cpu() for i in range(0, len(before), CHUNK)])


def memory_differences(model: Any, before: torch.Tensor, after: torch.Tensor, options: dict) -> dict[str, float]:
    """The memory's relative difference from the fp32 model's, for bf16 and FP8 Captioners with ``options``."""
    device = torch.device(options.get("device") or "cpu")
    oracle = model.to(device).eval()
    with torch.no_grad():
        reference = _chunked(lambda b, a: oracle.memory(b.to(device), a.to(device)), before, after)
    out = {}
    for precision in ("bf16", "fp8"):
        captioner = Captioner(model, None, precision=precision, **options)
        out[precision] = relative_difference(_chunked(captioner.memory, before, after), reference)
    return out


def correctness(model: Any, vocab: Any, tokens: torch.Tensor, pairs: list, truths: dict) -> dict[str, Any]:
    captions = {p.id: model.caption_text(vocab, row) for p, row in zip(pairs, tokens.tolist())}
    accuracy = caption_accuracy(captions, truths)
    return {"captions": captions, **{figure: accuracy.get(figure) for figure in FIGURES}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a trained procap checkpoint (.safetensors)")
    parser.add_argument("--data", required=True, help="the CLEVR-Change-format root of its pairs")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-pairs", type=int, default=None)
    parser.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    parser.add_argument("--configure-as", default="cuda", help="the configuration's device type (default cuda)")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    args = parser.parse_args(argv)
    started = time.monotonic()
    model, vocab, _ = load_checkpoint(args.checkpoint)
    size = model.config.image_size
    pairs = load_split("clevr-change", args.data, args.split)[: args.max_pairs]
    before = torch.stack([load_image(p.before_path, size) for p in pairs])
    after = torch.stack([load_image(p.after_path, size) for p in pairs])
    truths = scene_truths(args.data, pairs)
    options = {"device": args.device, "configure_as": args.configure_as, "max_len": model.config.max_caption_len}
    gemms = fp8_agreement(model, before, after, **options)
    with_cache = fp8_agreement(model, before, after, kv_cache_dtype="fp8", **options)
    with torch.no_grad():
        oracle = _chunked(lambda b, a: model.generate(b, a), before, after)
    runs = {
        "fp32_oracle": correctness(model, vocab, oracle, pairs, truths),
        "bf16": correctness(model, vocab, gemms.bf16_tokens, pairs, truths),
        "fp8": correctness(model, vocab, gemms.fp8_tokens, pairs, truths),
        "fp8_kv_cache": correctness(model, vocab, with_cache.fp8_tokens, pairs, truths),
    }
    paired = {
        figure: paired_difference(figure, [runs["fp8"]["captions"]], [runs["bf16"]["captions"]], truths)
        for figure in PAIRED_FIGURES
    }
    result: dict[str, Any] = {
        "checkpoint": args.checkpoint,
        "split": args.split,
        "pairs": len(pairs),
        "device": str(args.device or ("cuda" if torch.cuda.is_available() else "cpu")),
        "configure_as": args.configure_as,
        "fp8_gemm": "scaled_mm" if torch.cuda.is_available() and args.device != "cpu" else "reference (fake-quant)",
        "torch": torch.__version__,
        "gate_minimum": GATE_MINIMUM,
        "gate_fp8_gemms": {**gemms.figures, "passed": gemms.passed},
        "gate_fp8_gemms_and_kv_cache": {**with_cache.figures, "passed": with_cache.passed},
        "memory_rel_diff_vs_fp32": memory_differences(model, before, after, options),
        "correctness": {name: {f: run[f] for f in FIGURES} for name, run in runs.items()},
        "fp8_minus_bf16": {
            f: {k: paired[f][k] for k in ("difference", "low", "high", "level")} for f in PAIRED_FIGURES
        },
        "seconds": time.monotonic() - started,
    }
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here.parent)]  # procap from this checkout
    sys.exit(main())
