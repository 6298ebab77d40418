"""How far the bf16 fast path (``procap.fast.Captioner``) agrees with the fp32 eager oracle (``ProCap.generate``).

    python bench/bf16_agreement.py --random-preset clevr --k 2 --pairs 256 --out agreement.json
    python bench/bf16_agreement.py --checkpoint best.safetensors --data ROOT --split test --out agreement.json

Both run on the same device; the oracle in fp32 with TF32 off. Reported per model:

- ``token_agreement``: positions where the fast path's token equals the oracle's, over the oracle's tokens up to and
  including its EOS;
- ``caption_agreement``: pairs whose whole token sequence is equal;
- ``prefix_fraction``: mean length of the common prefix over the oracle's length (where the first divergence falls);
- ``fp32_fast_caption_agreement``: the fast path in fp32 (TF32 off) against the oracle, which should be 1.0;
- with ``--data``: the correctness scores (``procap.eval.correctness``) of both, so a bf16 flip can be judged by
  whether it changes what the caption gets right.

With ``--profile DIR`` it also profiles one batch-32 bf16 ``generate`` with ``torch.profiler`` and prints the top
kernels by device time (the Chrome trace goes to DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from procap.core.config import get_preset
from procap.fast import Captioner
from procap.fast.agreement import agreement, lengths_to_eos
from procap.loading.checkpoint import load_checkpoint
from procap.model.procap import ProCap

MAX_LEN = 25  # 24 decoding steps after BOS, the paper's counting
CHUNK = 64


def _chunks(fn, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(before[i : i + CHUNK], after[i : i + CHUNK]) for i in range(0, before.shape[0], CHUNK)])


def compare(model: ProCap, vocab: Any, before: torch.Tensor, after: torch.Tensor, device: torch.device) -> dict:
    """Oracle fp32 vs fast bf16 (and fast fp32) on the same pairs; returns the figures and the token tensors."""
    model = model.to(device).eval()
    max_len = min(MAX_LEN, model.config.max_caption_len)
    before, after = before.to(device), after.to(device)
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            oracle = _chunks(lambda b, a: model.generate(b, a, max_len=max_len), before, after)
        fp32 = Captioner(model, vocab, device=device, dtype=torch.float32, max_len=max_len, allow_tf32=False)
        fast32 = _chunks(fp32.generate, before, after)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    bf16 = Captioner(model, vocab, device=device, dtype=torch.bfloat16, max_len=max_len)
    fast = _chunks(bf16.generate, before, after)
    result = agreement(fast, oracle)
    result["fp32_fast_caption_agreement"] = agreement(fast32, oracle)["caption_agreement"]
    result["oracle_mean_tokens"] = float(lengths_to_eos(oracle).float().mean())
    return {"figures": result, "oracle": oracle.cpu(), "fast": fast.cpu()}


def _random_model(preset: str, k: int, device: torch.device) -> ProCap:
    torch.manual_seed(0)
    with torch.device(device):
        return ProCap(get_preset(preset, num_keyframes=k, max_caption_len=MAX_LEN))


def _random_images(n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    before = torch.rand(n, 3, size, size, generator=gen)
    # A local change on a shared background, like a change-captioning pair.
    after = before.clone()
    after[:, :, size // 4 : size // 2, size // 4 : size // 2] = torch.rand(n, 3, size // 4, size // 4, generator=gen)
    return before, after


def _dataset(root: str, split: str, size: int, max_pairs: int | None) -> tuple[list, torch.Tensor, torch.Tensor]:
    from procap.data.images import load_image
    from procap.data.loaders import load_clevr_change

    pairs = load_clevr_change(root, split)[:max_pairs]
    before = torch.stack([load_image(p.before_path, size) for p in pairs])
    after = torch.stack([load_image(p.after_path, size) for p in pairs])
    return pairs, before, after


def _correctness(model: ProCap, vocab: Any, tokens: torch.Tensor, pairs: list, root: str) -> dict[str, Any]:
    from procap.eval.correctness import caption_accuracy, scene_truths

    captions = {p.id: model.caption_text(vocab, row) for p, row in zip(pairs, tokens.tolist())}
    return caption_accuracy(captions, scene_truths(root, pairs))


def profile(model: ProCap, device: torch.device, out_dir: Path, batch: int = 32) -> list[dict[str, Any]]:
    """Profile bf16 ``Captioner.generate`` at one batch; print and return the top device kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    captioner = Captioner(model, None, device=device, dtype=torch.bfloat16, max_len=MAX_LEN, batch_sizes=(batch,))
    before, after = (t.to(device) for t in _random_images(batch, model.config.image_size))
    for _ in range(3):  # capture the graphs and warm up outside the trace
        captioner.generate(before, after)
    torch.cuda.synchronize(device)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            captioner.generate(before, after)
        torch.cuda.synchronize(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out_dir / f"profile-b{batch}.json"))
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    rows = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:25]
    top = [
        {
            "name": e.key,
            "calls": e.count,
            "self_device_ms": e.self_device_time_total / 1e3 / 3,
            "share": e.self_device_time_total / total if total else None,
        }
        for e in rows
    ]
    print(f"top kernels, bf16 generate at batch {batch} (per call; total {total / 1e3 / 3:.2f} ms device time):")
    for row in top:
        print(
            f"  {row['self_device_ms']:8.3f} ms  {100 * row['share']:5.1f} %  {row['calls'] // 3:5d}x  {row['name'][:90]}"
        )
    return top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", help="a trained procap checkpoint (.safetensors)")
    parser.add_argument("--data", help="CLEVR-Change-format root for --checkpoint's pairs")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-pairs", type=int, default=None)
    parser.add_argument("--random-preset", help="a preset with random weights (e.g. clevr)")
    parser.add_argument("--k", type=int, default=2, help="keyframes of the random-weight model")
    parser.add_argument("--pairs", type=int, default=256, help="random image pairs for the random-weight model")
    parser.add_argument("--profile", type=Path, help="also profile a batch-32 run of the random model; trace here")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bf16_agreement: needs a CUDA GPU (the fast path's bf16 and graphs are CUDA features)", file=sys.stderr)
        return 2
    if bool(args.checkpoint) == bool(args.random_preset):
        print("bf16_agreement: give exactly one of --checkpoint and --random-preset", file=sys.stderr)
        return 2
    if args.checkpoint and not args.data:
        print("bf16_agreement: --checkpoint needs --data (the pairs to caption)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__}
    if args.checkpoint:
        model, vocab, _ = load_checkpoint(args.checkpoint)
        pairs, before, after = _dataset(args.data, args.split, model.config.image_size, args.max_pairs)
        run = compare(model, vocab, before, after, device)
        result.update(model=args.checkpoint, split=args.split, **run["figures"])
        result["correctness_oracle_fp32"] = _correctness(model, vocab, run["oracle"], pairs, args.data)
        result["correctness_fast_bf16"] = _correctness(model, vocab, run["fast"], pairs, args.data)
    else:
        model = _random_model(args.random_preset, args.k, device)
        before, after = _random_images(args.pairs, model.config.image_size)
        run = compare(model, None, before, after, device)
        result.update(model=f"{args.random_preset} (random weights, k={args.k})", **run["figures"])
        if args.profile:
            result["profile_top_kernels_b32"] = profile(model, device, args.profile)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (list, dict))}, indent=1))
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
