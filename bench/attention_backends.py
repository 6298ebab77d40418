"""Every attention backend timed on the encoder's and the decoding step's shapes, for ``auto``'s measured order.

    python bench/attention_backends.py --out attention.json            # on a GPU: the clevr shapes at b1 and b32
    python bench/attention_backends.py --dry-run --out attention.json  # on a CPU: the tiny preset's shapes
    python bench/attention_backends.py --order-from attention.json     # the MEASURED_ORDER entries it supports

Shapes (``--preset``, k = 2; batches ``--batches``): the encoder's self attention over the whole sequence (use
``encoder``), and the decoding step's two attentions of one query row per head (use ``decode``): the cross attention
over the memory's cached keys (no mask) and the self attention over the aligned key slots with the step's additive
mask. Keys and values are the strided views the model hands over (heads split from (B, L, D) rows; the step's
(B, N, 2D) cache), since a backend's kernel choice depends on the layout.

Every backend of ``procap.kernels.attention.BACKENDS`` runs each shape as a layer set to it would (a masked call of a
``flash`` layer runs on ``sdpa``: ``backend_for_mask``); beside them, on unmasked calls, flash-attn 3 where its
``flash_attn_interface`` is installed (``flash3``), and on the unmasked decode shapes the split-K kernels
(``procap.kernels.decode_attention``, the decoder's ``split_k_attention`` option; ``split_k``). A
backend is checked against the fp32 ``math`` reference on the same inputs before it is timed; one that fails the
check, or cannot run, is recorded with the reason and ranked nowhere. On a GPU each backend's calls are captured in a
CUDA graph, ``--calls`` of them back to back, and each replay is timed with CUDA events (the decoding step replays a
graph, so launch overhead is not what it pays); where capture fails the calls are timed eagerly, and the result
says so. One profiled call per shape and backend names the kernels that ran. The dry run times with the wall clock.

The order (:func:`measured_order`): per use, the backends that passed on every shape of it, by the geometric mean of
their time over the fastest one's on each shape. ``--order-from`` prints it as the lines of
``procap.kernels.attention.MEASURED_ORDER`` (docs/gpu.md, "Attention backend by measurement"); ``split_k`` and
``flash3`` are no backends and are reported apart (the decoder option's default changes by hand, after
``gpu_tune``'s ``decode_split_k`` variant; flash-attn 3 would first need a backend).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPLIT_K = "split_k"  # the decoder's split-K kernels, timed beside the backends on the unmasked decode shapes
FLASH3 = "flash3"  # flash-attn 3 (Hopper, ``flash_attn_interface``) where installed: no backend yet, timed beside them
EXTRAS = (SPLIT_K, FLASH3)  # candidates that are no backend: reported, never in the order
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}  # max |error| against the fp32 reference


@dataclass(frozen=True)
class Shape:
    """One attention call: (B, H, Lq, Lk, Dh), its use (``encoder`` / ``decode``), and whether the step's additive
    mask (half of the key slots visible) comes with it."""

    use: str
    batch: int
    heads: int
    queries: int
    keys: int
    head_dim: int
    masked: bool = False


def shapes_for(preset: str, batches: Sequence[int]) -> dict[str, Shape]:
    """The encoder's and the decoding step's attention calls of ``preset`` (k = 2) at each batch."""
    from procap.core.config import get_preset
    from procap.model.decoder_step import KEY_ALIGNMENT

    config = get_preset(preset, num_keyframes=2)
    tokens, slots = config.memory_tokens, -(-config.max_caption_len // KEY_ALIGNMENT) * KEY_ALIGNMENT
    enc_heads, dec_heads = config.enc_heads, config.dec_heads
    enc_dh, dec_dh = config.enc_dim // enc_heads, config.dec_dim // dec_heads
    shapes = {}
    for b in batches:
        shapes[f"encoder_b{b}"] = Shape("encoder", b, enc_heads, tokens, tokens, enc_dh)
        shapes[f"decode_cross_b{b}"] = Shape("decode", b, dec_heads, 1, tokens, dec_dh)
        shapes[f"decode_self_b{b}"] = Shape("decode", b, dec_heads, 1, slots, dec_dh, masked=True)
    return shapes


def make_inputs(shape: Shape, dtype: Any, device: Any) -> tuple[Any, Any, Any, Any]:
    """q, k, v laid out as the model lays them out, and the additive mask (or None)."""
    import torch

    b, h, d = shape.batch, shape.heads, shape.head_dim
    generator = torch.Generator(device=device).manual_seed(0)

    def rows(length: int, width: int) -> Any:
        return torch.randn(b, length, width, generator=generator, device=device).to(dtype)

    if shape.use == "encoder":  # split_heads of the projections' (B, L, D) outputs
        q, k, v = (rows(shape.keys, h * d).view(b, shape.keys, h, d).transpose(1, 2) for _ in range(3))
        return q, k, v, None
    cache = rows(shape.keys, 2 * h * d)  # the step's (B, N, 2D) buffer and its (B, H, N, Dh) views
    k, v = (cache[..., i * h * d : (i + 1) * h * d].view(b, shape.keys, h, d).transpose(1, 2) for i in range(2))
    q = rows(1, h * d).view(b, h, 1, d)
    if not shape.masked:
        return q, k, v, None
    mask = torch.full((shape.keys,), float("-inf"), dtype=dtype, device=device)
    mask[: shape.keys // 2] = 0.0
    return q, k, v, mask.view(1, 1, 1, shape.keys)


def candidates(shape: Shape) -> list[str]:
    """What runs a shape: every backend but ``auto``; on unmasked calls flash-attn 3, and on the unmasked decode
    calls the split-K kernels."""
    from procap.kernels.attention import BACKENDS

    names = [b for b in BACKENDS if b != "auto"]
    if not shape.masked:
        names += [FLASH3, SPLIT_K] if shape.use == "decode" else [FLASH3]
    return names


def flash3_call(q: Any, k: Any, v: Any) -> Callable[[], Any] | str:
    """flash-attn 3's call on (B, H, L, Dh) tensors, or why it cannot run here."""
    import importlib.util

    if not q.is_cuda or importlib.util.find_spec("flash_attn_interface") is None:
        return "flash-attn 3 (flash_attn_interface) needs a CUDA GPU and the package"
    from flash_attn_interface import flash_attn_func

    def call() -> Any:
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)  # some versions return (out, lse)

    return call


def call_for(name: str, inputs: tuple[Any, Any, Any, Any]) -> tuple[str, Callable[[], Any] | str]:
    """What a layer set to ``name`` runs on ``inputs`` (``flash`` with a mask: ``sdpa``), and its call, or why it
    cannot run here."""
    from procap.kernels import dispatch
    from procap.kernels.attention import attention, backend_for_mask, unavailable_reason
    from procap.kernels.split_k_attention import DECODE_ATTENTION, decode_attention

    q, k, v, mask = inputs
    if name == FLASH3:
        return name, flash3_call(q, k, v)
    if name == SPLIT_K:
        reason = dispatch.why_not(DECODE_ATTENTION, "triton", q.device.type, q.dtype)
        return name, reason or (lambda: decode_attention(q, k, v, impl="triton"))
    backend = backend_for_mask(name, mask)
    reason = unavailable_reason(backend, q.device, q.dtype)
    return backend, reason or (lambda: attention(q, k, v, attn_mask=mask, backend=backend))


def time_on_gpu(call: Callable[[], Any], calls: int, iters: int) -> tuple[float, bool]:
    """Milliseconds per call (median over ``iters`` replays of ``calls`` captured calls) and whether a CUDA graph
    held them (False: the capture failed, and each call was timed eagerly)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph: Any = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                call()
        run, per_run = graph.replay, calls
    except RuntimeError:
        graph, run, per_run = None, call, 1
    times = []
    for _ in range(iters + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_run)
    return statistics.median(times[2:]), graph is not None


def time_on_cpu(call: Callable[[], Any], iters: int) -> float:
    """Milliseconds per call on the wall clock (median), after one untimed call."""
    call()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kernels_of(call: Callable[[], Any]) -> list[str]:
    """The device kernels one call launches, by name (CUDA only)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type != DeviceType.CPU})


def measure(name: str, shape: Shape, inputs: tuple[Any, Any, Any, Any], reference: Any, args: Any) -> dict[str, Any]:
    """One backend on one shape: skipped (why), failed (the error), wrong (its error), or timed."""
    runs, call = call_for(name, inputs)
    if isinstance(call, str):
        return {"skipped": call}
    note = {} if runs == name else {"runs": runs}
    try:
        error = float((call().float() - reference).abs().max())
    except Exception as exc:  # noqa: BLE001 - a backend refusing a shape is a finding, not the end of the run
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}", **note}
    dtype = str(inputs[0].dtype).replace("torch.", "")
    result: dict[str, Any] = {"max_abs_error": error, "ok": error <= TOLERANCE[dtype], **note}
    if not result["ok"]:
        return result
    if inputs[0].is_cuda:
        result["median_ms"], result["graph"] = time_on_gpu(call, args.calls, args.iters)
        result["kernels"] = kernels_of(call)
    else:
        result["median_ms"] = time_on_cpu(call, args.iters)
    return result


def run_all(args: Any, device: Any, dtype: Any) -> dict[str, Any]:
    """Every candidate on every shape: ``{shape name: {"shape": ..., "backends": {name: result}}}``."""
    from procap.kernels.attention import attention_math

    timings: dict[str, Any] = {}
    for shape_name, shape in shapes_for(args.preset, args.batches).items():
        inputs = make_inputs(shape, dtype, device)
        q, k, v, mask = inputs
        reference = attention_math(q.float(), k.float(), v.float(), attn_mask=mask)
        results = {name: measure(name, shape, inputs, reference, args) for name in candidates(shape)}
        timings[shape_name] = {"shape": asdict(shape), "backends": results}
        del reference
    return timings


def measured_order(results: dict[str, Any], use: str) -> list[str]:
    """The backends (``split_k`` and ``flash3`` aside) that passed on every shape of ``use``, fastest first by the geometric mean
    of their time over the fastest candidate's on each shape."""
    from procap.kernels.attention import BACKENDS

    shapes = [entry for entry in results["timings"].values() if entry["shape"]["use"] == use]
    ratios: dict[str, list[float]] = {}
    for entry in shapes:
        timed = _timed(entry["backends"])
        fastest = min(timed.values(), default=math.inf)
        for name, ms in timed.items():
            ratios.setdefault(name, []).append(ms / fastest if fastest > 0 else 1.0)
    ranked = [n for n in ratios if n in BACKENDS and len(ratios[n]) == len(shapes)]
    return sorted(ranked, key=lambda n: (statistics.geometric_mean(ratios[n]), n))


def _timed(backends: dict[str, Any]) -> dict[str, float]:
    """The median milliseconds of the candidates that passed and were timed."""
    return {name: r["median_ms"] for name, r in backends.items() if r.get("ok") and "median_ms" in r}


def order_lines(results: dict[str, Any], source: str) -> list[str]:
    """The ``MEASURED_ORDER`` entries of a results file, and the standing of the candidates that are no backend
    (split-K, flash-attn 3) on each shape they ran."""
    arch = results["architecture"]
    lines = [f"    # {results['device']}, {results['dtype']}, {source}"]
    for use in ("encoder", "decode"):
        order = measured_order(results, use)
        if order:
            lines.append(f"    ({arch!r}, {use!r}): ({', '.join(repr(n) for n in order)},),")
    for shape_name, entry in results["timings"].items():
        timed = _timed(entry["backends"])
        extras = {name: timed.pop(name) for name in EXTRAS if name in timed}
        if extras and timed:
            best = min(timed, key=timed.__getitem__)
            shown = ", ".join(f"{name} {ms:.4f} ms" for name, ms in extras.items())
            lines.append(f"    # {shape_name}: {shown}, best backend {best} {timed[best]:.4f} ms")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; bad lists and counts exit with status 2."""
    parser = argparse.ArgumentParser(prog="python bench/attention_backends.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, the tiny preset at batches 1,2")
    parser.add_argument("--preset", help="model preset whose shapes run (default clevr; tiny with --dry-run)")
    parser.add_argument("--batches", help="comma-separated batch sizes (default 1,32; 1,2 with --dry-run)")
    parser.add_argument("--iters", type=int, default=20, help="timed replays (or calls) per backend and shape")
    parser.add_argument("--calls", type=int, default=20, help="calls captured in one graph replay (GPU)")
    parser.add_argument("--out", type=Path, help="write the results JSON here")
    parser.add_argument("--order-from", type=Path, help="print the MEASURED_ORDER entries of a results JSON and exit")
    args = parser.parse_args(argv)
    args.preset = args.preset or ("tiny" if args.dry_run else "clevr")
    try:
        args.batches = sorted({int(b) for b in (args.batches or ("1,2" if args.dry_run else "1,32")).split(",")})
    except ValueError:
        parser.error(f"--batches takes comma-separated integers, got {args.batches!r}")
    if min(args.batches) < 1 or args.iters < 1 or args.calls < 1:
        parser.error("--batches, --iters and --calls must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.order_from:
        print("\n".join(order_lines(json.loads(args.order_from.read_text()), args.order_from.name)))
        return 0
    import torch

    from procap.kernels.attention import device_architecture

    if not args.dry_run and not torch.cuda.is_available():
        print("attention_backends: needs a CUDA GPU (or --dry-run on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "architecture": device_architecture(device),
        "torch": torch.__version__,
        "dtype": str(dtype).replace("torch.", ""),
        "preset": args.preset,
        "timings": run_all(args, device, dtype),
    }
    results["order"] = {use: measured_order(results, use) for use in ("encoder", "decode")}
    if args.out:
        from procap.core.files import atomic_write_json

        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, results, indent=1)
    print("\n".join(order_lines(results, str(args.out or "not written"))))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # procap from this checkout
    sys.exit(main())
