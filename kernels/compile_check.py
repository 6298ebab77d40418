"""Compile every Triton kernel the dispatch can launch for a GPU, without a GPU, and report its resources.

    python -m procap.kernels.compile_check [--arch 90] [--json report.json]

The interpreter (``TRITON_INTERPRET=1``, how the CPU tests run the kernels) accepts code that the compiler refuses, for
example a plain-int module global read inside a kernel. This check runs the real launchers, on CPU tensors, with
a compile-only Triton driver that reports a CUDA target (sm_90 by default): Triton binds and specialises each launch
as it would on that GPU, a ``jit_cache_hook`` records the launch instead of running it, and every distinct
(kernel, signature, constexprs, specialisation) is then compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``. The ``ptxas -v`` log of the installed
Triton's own assembler step (its ptxas, its flags) reports registers and spills; Triton's metadata the shared memory.
The launches cover every dtype (fp32, fp16, bf16), every mode (forward/backward, with and without the optional
inputs) and the shapes of every preset, at one and at 128 pairs.

Exit status 1 (and ``ok: false`` per kernel) when a kernel fails to compile, spills, or needs more than
:data:`SHARED_MEMORY_LIMIT`; also when a ``*_kernel`` of a kernel module was never launched. Must run in a process
where ``TRITON_INTERPRET`` is unset (the tests start one). Registers and spills depend on the Triton version:
``tools/compile_check_triton.sh VERSION`` runs the check under another one (the GPU image's) in a scratch venv.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from procap.kernels.dispatch import set_recording_launches

SHARED_MEMORY_LIMIT = 227 * 1024  # H100 / H200: opt-in dynamic shared memory per block
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_NOT_KERNEL_MODULES = {"compile_check", "dispatch", "occupancy", "__main__"}


@dataclass
class KernelReport:
    """One compiled specialisation of a kernel."""

    kernel: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    shared_bytes: int | None = None
    error: str | None = None
    ok: bool = field(default=False)


def _driver_class(target):
    from triton.backends.driver import DriverBase

    class CompileOnlyDriver(DriverBase):
        """Reports ``target`` as the current device so the JIT binds launches for it; runs nothing."""

        @classmethod
        def is_active(cls) -> bool:
            return False  # never picked automatically

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self):
            return target

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError("the compile-only driver runs nothing")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    return CompileOnlyDriver


@contextlib.contextmanager
def recording(arch: int = 90) -> Iterator[list[tuple[Any, dict]]]:
    """Within the block, Triton launches are recorded as ``(JITFunction, compile dict)`` and not run."""
    import triton
    from triton.backends.compiler import GPUTarget

    records: list[tuple[Any, dict]] = []

    def hook(*, fn, compile, **_: Any) -> bool:
        records.append((fn.jit_function, compile))
        return True  # "handled": the JIT neither compiles nor launches

    previous_hook = triton.knobs.runtime.jit_cache_hook
    triton.runtime.driver.set_active(_driver_class(GPUTarget("cuda", arch, 32))())
    triton.knobs.runtime.jit_cache_hook = hook
    set_recording_launches(True)  # launchers accept the CPU tensors they are handed
    try:
        yield records
    finally:
        set_recording_launches(False)
        triton.knobs.runtime.jit_cache_hook = previous_hook
        triton.runtime.driver._active = None  # back to the default driver, created on demand


# -- the launches ---------------------------------------------------------------------------------------------------


def _preset_configs() -> list[Any]:
    from procap.core.config import PRESETS

    return list(PRESETS.values())


def _launch_masking(config: Any, pairs: int) -> None:
    masking_op = importlib.import_module("procap.kernels.masking")  # the package attribute is the function

    t, grid, d = config.num_frames, config.grid_size, config.enc_dim
    rows, n = 2 * pairs, t * grid * grid  # stage 1 masks positives and consistency negatives together
    scheme, block = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, 4, dtype=torch.long)
    tables = [torch.empty(m, d) for m in (t, grid, grid)]
    for dtype in DTYPES:
        x = torch.empty(rows, n, d, dtype=dtype)
        _, mask = masking_op.masking_fwd(
            x, scheme, torch.empty(rows), torch.empty(rows, n), block, torch.empty(d), *tables
        )
        for need_grad_x in (True, False):
            masking_op.masking_bwd(x, torch.zeros_like(mask), t, grid, grid, need_grad_x)


def _launch_vq(config: Any, pairs: int) -> None:
    from procap.kernels import vq as vq_op

    rows = pairs * config.num_frames * config.grid_size**2
    for dtype in DTYPES:
        vq_op.vq_nearest_fwd(
            torch.empty(rows, config.vqgan.embed_dim, dtype=dtype),
            torch.empty(config.vqgan.n_embed, config.vqgan.embed_dim, dtype=dtype),
        )


def _group_norm_modes(x: torch.Tensor, in_bias: torch.Tensor) -> tuple[tuple[Any, Any, Any], ...]:
    """(residual, in_bias, write_sum): plain; chained blocks; a bias-free conv read by the norm alone; the same with
    its sum kept (the block's shortcut); the chained sum with the previous conv's bias."""
    return ((None, None, None), (x, None, None), (None, in_bias, False), (None, in_bias, True), (x, in_bias, True))


def _launch_group_norm(config: Any, pairs: int) -> None:
    """Every path's forward (:data:`procap.kernels.groupnorm.GROUP_NORM_PATHS`) at every VQGAN level, dtype and
    mode, each with the one backward (after the chunked forward only: it does not depend on the path)."""
    from procap.kernels import groupnorm

    vq = config.vqgan
    images = 2 * pairs  # before and after
    for level, mult in enumerate(vq.ch_mult):
        channels, size = vq.ch * mult, config.image_size // 2**level
        weight, bias = torch.ones(channels), torch.empty(channels)
        for dtype in DTYPES:
            x = torch.empty(images, channels, size, size, dtype=dtype, memory_format=torch.channels_last)
            for path in groupnorm.GROUP_NORM_PATHS:
                for silu in (True, False):
                    for residual, ib, write_sum in _group_norm_modes(x, torch.empty(channels, dtype=dtype)):
                        y, s, _, rstd, channel_mean, scale = groupnorm.group_norm_fwd(
                            x, weight, bias, 32, 1e-6, silu, residual, in_bias=ib, write_sum=write_sum, path=path
                        )
                        if path != "chunked" or write_sum is False or s is None:  # None only when not written
                            continue  # the backward reads the written sum
                        for ds in (None, x):
                            groupnorm.group_norm_bwd(y, ds, s, weight, bias, rstd, channel_mean, scale, silu)


def _launch_conv_in(config: Any, pairs: int) -> None:
    from procap.kernels import conv_in

    vq = config.vqgan
    norm = torch.ones(vq.ch)
    for dtype in DTYPES:
        # the images' own 3 channels in the encoder's two layouts (the conv_in_stats option), and the 8 of the padded
        # cuDNN input the kernel also takes
        for channels, layout in ((3, torch.channels_last), (3, torch.contiguous_format), (8, torch.channels_last)):
            size = (2 * pairs, channels, config.image_size, config.image_size)
            images = torch.empty(size, dtype=dtype, memory_format=layout)
            weight, bias = torch.empty(vq.ch, channels, 3, 3, dtype=dtype), torch.empty(vq.ch, dtype=dtype)
            conv_in.conv_in_norm_triton(images, weight, bias, norm, norm, 32, 1e-6, True)


def _launch_bias_add(config: Any, pairs: int) -> None:
    from procap.kernels import residual as residual_op

    vq = config.vqgan
    for level, mult in enumerate(vq.ch_mult):
        channels, size = vq.ch * mult, config.image_size // 2**level
        for dtype in DTYPES:
            x = torch.empty(2 * pairs, channels, size, size, dtype=dtype, memory_format=torch.channels_last)
            for shortcut in (None, x):
                residual_op.bias_add_triton(x, torch.empty(channels), shortcut)


def _launch_decode(config: Any, pairs: int) -> None:
    from procap.kernels import greedy, layernorm

    d, steps = config.dec_dim, config.max_caption_len - 1
    for dtype in DTYPES:
        x = torch.empty(pairs, d, dtype=dtype)
        weight = torch.empty(d, dtype=dtype)
        for out_dtype in (None, torch.float32):  # the residual stream's norms; the final norm feeding fp32 logits
            layernorm.add_layer_norm_triton(x, x, weight, weight, 1e-5, out_dtype)
        greedy.greedy_step_triton(
            torch.empty(pairs, config.vocab_size),
            torch.empty(pairs, dtype=torch.bool),
            torch.empty(pairs, dtype=torch.long),
            torch.empty(pairs, steps, dtype=torch.long),
            torch.empty(1, dtype=torch.long),
            x,
            torch.empty(32, dtype=dtype),
            torch.empty(config.vocab_size, d, dtype=dtype),
            torch.empty(config.max_caption_len, d, dtype=dtype),
        )


def _launch_logits_pick(config: Any, pairs: int) -> None:
    from procap.kernels import logits_pick

    d, v, steps = config.dec_dim, config.vocab_size, config.max_caption_len - 1
    tiles = logits_pick.logits_tiles(v)
    hidden, bias, logits = torch.empty(pairs, d), torch.empty(v), torch.empty(pairs, v)
    for dtype in DTYPES:  # the projection's weights and the activations in one dtype (the step passes fp32 weights)
        logits_pick.greedy_logits_step_triton(
            hidden,
            torch.empty(v, d, dtype=dtype),
            bias,
            logits,
            torch.empty(pairs, tiles),
            torch.empty(pairs, tiles, dtype=torch.long),
            torch.empty(pairs, dtype=torch.bool),
            torch.empty(pairs, dtype=torch.long),
            torch.empty(pairs, steps, dtype=torch.long),
            torch.empty(1, dtype=torch.long),
            torch.empty(pairs, d, dtype=dtype),
            torch.empty(32, dtype=dtype),
            torch.empty(v, d, dtype=dtype),
            torch.empty(config.max_caption_len, d, dtype=dtype),
        )


def _launch_split_k_attention(config: Any, pairs: int) -> None:
    from procap.kernels import split_k_attention

    d, heads, n = config.dec_dim, config.dec_heads, config.memory_tokens
    for dtype in DTYPES:  # the step's cross attention: strided (B, H, N, Dh) views of its (B, N, 2D) cache
        cache = torch.empty(pairs, n, 2 * d, dtype=dtype)
        keys, values = (cache[..., i * d : (i + 1) * d].view(pairs, n, heads, -1).transpose(1, 2) for i in range(2))
        query = torch.empty(pairs, d, dtype=dtype).view(pairs, heads, 1, -1)
        split_k_attention.decode_attention_triton(query, keys, values)


def _launch_decode_mlp(config: Any, pairs: int) -> None:
    decode_mlp = importlib.import_module("procap.kernels.decode_mlp")  # the package attribute is the function

    d, hidden = config.dec_dim, config.dec_ffn
    partials, counters = decode_mlp.decode_mlp_workspace(pairs, d, hidden, "cpu")
    for dtype in DTYPES:
        decode_mlp.decode_mlp_triton(
            torch.empty(pairs, d, dtype=dtype),
            torch.empty(hidden, d, dtype=dtype),
            torch.empty(hidden, dtype=dtype),
            torch.empty(d, hidden, dtype=dtype),
            torch.empty(d, dtype=dtype),
            partials,
            counters,
        )


def _launch_encoder(config: Any, pairs: int) -> None:
    from procap.kernels import layernorm

    linear_gelu = importlib.import_module("procap.kernels.linear_gelu")  # the package attribute is the function
    d = config.enc_dim
    rows = pairs * config.num_frames * config.grid_size**2  # the stage-2 sequence's visual tokens
    for dtype in DTYPES:
        x = torch.empty(rows, d, dtype=dtype)
        weight = torch.empty(d, dtype=dtype)
        layernorm.add_layer_norm_triton(x, x, weight, weight, 1e-5)  # residual + LayerNorm between encoder blocks
        fc1 = torch.empty(config.enc_mlp, d, dtype=dtype)  # the MLP's fc1 with the erf GELU epilogue
        linear_gelu.linear_gelu_triton(x, fc1, torch.empty(config.enc_mlp, dtype=dtype))


LAUNCHERS = (
    _launch_masking,
    _launch_vq,
    _launch_group_norm,
    _launch_conv_in,
    _launch_bias_add,
    _launch_decode,
    _launch_logits_pick,
    _launch_split_k_attention,
    _launch_decode_mlp,
    _launch_encoder,
)


def kernel_modules() -> list[str]:
    """The modules of ``procap.kernels`` that define Triton kernels (every public-looking submodule)."""
    import procap.kernels as package

    names = [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]
    return [f"procap.kernels.{n}" for n in sorted(names) if n not in _NOT_KERNEL_MODULES]


def launchable_kernels() -> set[str]:
    """``module.name`` of every ``@triton.jit`` function named ``*_kernel`` (helpers are inlined into those)."""
    from triton.runtime.jit import JITFunction

    found = set()
    for module_name in kernel_modules():
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and name.endswith("_kernel"):
                found.add(f"{module_name}.{name}")
    return found


# -- compiling ------------------------------------------------------------------------------------------------------


def _ptxas_resources(ptx: str, arch: int, options: dict[str, Any]) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from ``ptxas -v``, run by the installed Triton's own backend.

    The ptxas binary and its flags change between Triton versions (for sm_90, 3.6 runs the CUDA 12.8 ``ptxas``, 3.9
    the CUDA 13.4 ``ptxas-blackwell`` with ``--regAllocOptLevel=2``), and register allocation with them, so the figures
    come from the backend's ``make_cubin`` with its log dumped rather than from a command line kept here.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", arch, 32))
    log = io.StringIO()
    with triton.knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        triton.knobs.nvidia.dump_ptxas_log = True  # make_cubin prints the log (to stdout) only when asked
        backend.make_cubin(ptx, {}, backend.parse_options(dict(options)), arch)
    text = log.getvalue()
    registers = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if registers is None or spills is None:
        raise RuntimeError(f"no resource usage in the ptxas log of Triton {triton.__version__}: {text[-300:]!r}")
    return int(registers.group(1)), int(spills.group(1)), int(spills.group(2))


def _describe(kernel: Any, compile_info: dict) -> KernelReport:
    names = kernel.arg_names
    constexprs = {names[path[0]]: value for path, value in compile_info["constants"].items() if len(path) == 1}
    signature = {k: v for k, v in compile_info["signature"].items() if v != "constexpr"}
    return KernelReport(
        kernel=f"{kernel.fn.__module__}.{kernel.fn.__name__}",
        signature=signature,
        constexprs={k: (v if isinstance(v, int | float | bool) else str(v)) for k, v in constexprs.items()},
        num_warps=compile_info["num_warps"],
        num_stages=compile_info["num_stages"],
    )


def compile_records(records: list[tuple[Any, dict]], arch: int = 90) -> list[KernelReport]:
    """Compile each distinct recorded launch for ``cuda:arch`` and measure it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import PTXASError

    target = GPUTarget("cuda", arch, 32)
    reports, seen = [], set()
    for kernel, info in records:
        # One compile per (kernel, argument types, constexprs, launch options): the alignment hints Triton also
        # specialises on vary with every shape and change vectorisation, not what the kernel does.
        key = (id(kernel), repr(info["signature"]), repr(info["constants"]), info["num_warps"], info["num_stages"])
        if key in seen:
            continue
        seen.add(key)
        report = _describe(kernel, info)
        options = {k: info[k] for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion") if k in info}
        try:
            compiled = triton.compile(
                ASTSource(kernel, info["signature"], info["constants"], info["configs"][0]),
                target=target,
                options=options,
            )
            report.shared_bytes = int(compiled.metadata.shared)
            resources = _ptxas_resources(compiled.asm["ptx"], arch, options)
            report.registers, report.spill_stores, report.spill_loads = resources
            report.ok = report.spill_stores == 0 and report.spill_loads == 0
            report.ok = report.ok and report.shared_bytes <= SHARED_MEMORY_LIMIT
        except (CompilationError, PTXASError, RuntimeError, ValueError, TypeError) as exc:
            # A compile error is the finding: keep going and report every kernel.
            cause = exc.__cause__ or exc  # Triton wraps the reason (e.g. a non-constexpr global) in a source excerpt
            message = " ".join(str(cause).split())
            message = message if len(message) <= 600 else f"{message[:120]} ... {message[-450:]}"  # reason is last
            report.error = f"{type(cause).__name__}: {message}"
        reports.append(report)
    return reports


def _version_of(ptxas_banner: str) -> str:
    """``12.8.93`` from ``ptxas --version``'s ``... release 12.8, V12.8.93``; the banner's last line otherwise."""
    found = re.search(r"\bV(\d+(?:\.\d+)+)", ptxas_banner)
    return found.group(1) if found else ptxas_banner.strip().splitlines()[-1]


def run(arch: int = 90) -> dict[str, Any]:
    """Record every launch, compile each distinct one, and return the report (``ok`` overall and per kernel)."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas_version

    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")  # 3.9 announces a default change
    torch.set_num_threads(1)  # the launchers' host-side torch ops work on a few hundred values; threads only spin

    with recording(arch) as records:
        for config in _preset_configs():
            for pairs in (1, 128):
                for launch in LAUNCHERS:
                    launch(config, pairs)
    reports = compile_records(records, arch)
    launched = {r.kernel for r in reports}
    never_launched = sorted(launchable_kernels() - launched)
    return {
        "target": f"cuda:{arch}",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "ptxas": _version_of(get_ptxas_version(arch)),
        "shared_memory_limit": SHARED_MEMORY_LIMIT,
        "never_launched": never_launched,
        "ok": all(r.ok for r in reports) and not never_launched,
        "kernels": [asdict(r) for r in reports],
    }


def _table(report: dict[str, Any]) -> str:
    lines = [f"{'kernel':<48} {'dtypes':<22} {'constexprs':<46} {'regs':>4} {'spill':>5} {'smem':>7}  status"]
    for r in report["kernels"]:
        dtypes = ",".join(sorted({v[1:] for v in r["signature"].values() if v.startswith("*fp") or v == "*bf16"}))
        const = ",".join(f"{k}={v}" for k, v in r["constexprs"].items())
        status = "ok" if r["ok"] else (r["error"] or "SPILLS OR SHARED MEMORY")
        spill = "-" if r["spill_stores"] is None else r["spill_stores"] + r["spill_loads"]
        lines.append(
            f"{r['kernel'].split('.')[-1]:<48} {dtypes:<22} {const[:46]:<46} {r['registers'] or '-':>4} "
            f"{spill:>5} {r['shared_bytes'] if r['shared_bytes'] is not None else '-':>7}  {status[:200]}"
        )
    if report["never_launched"]:
        lines.append(f"never launched (add them to LAUNCHERS): {', '.join(report['never_launched'])}")
    kernels = report["kernels"]
    spilling = sum(1 for r in kernels if r["spill_stores"] or r["spill_loads"])
    failed = sum(1 for r in kernels if r["error"] is not None)
    lines.append(
        f"{len(kernels)} variants for {report['target']}, Triton {report['triton']}, ptxas {report['ptxas']}: "
        f"{spilling} spilling, {failed} failed, {len(report['never_launched'])} never launched -> "
        + ("ok" if report["ok"] else "FAILED")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m procap.kernels.compile_check", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (default 90)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_check: unset TRITON_INTERPRET (the interpreter replaces the compiler)", file=sys.stderr)
        return 2
    report = run(args.arch)
    print(_table(report))
    if args.json:
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
