"""Assemble the parts ``bench/gpu_check.sh`` wrote into one results JSON (run by the script after every step).

    python bench/gpu_check_report.py --parts DIR --out FILE

Reads ``DIR/steps/*.json`` (one record per step the script ran: command, exit code, seconds), ``DIR/*.xml``
(pytest JUnit reports), ``DIR/*.bench.json`` (pytest-benchmark reports) and ``DIR/tune.json`` (bench/gpu_tune.py),
and writes ``FILE`` (temporary file + rename) with the device, versions, date, git commit, every command, the test
counts (with the ids of failing tests), every benchmark (its ``extra_info`` and median), the tuning results and a
short summary of the figures a GPU run is for, the whole-suite counts included. Missing parts are reported as
missing, never invented.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

STEPS = ("setup", "e2e", "kernels", "train", "profile", "ncu", "suite")  # the steps of bench/gpu_check.sh


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Device and versions, from torch (and nvidia-smi for the driver)."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else (platform.processor() or "cpu"),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    env["nvidia_smi"] = smi.splitlines() if smi else None
    return env


def _test_id(case: ET.Element) -> str:
    """The pytest id of a JUnit ``testcase``: ``path.py::Class::name``.

    With ``junit_family=xunit1`` (as the suite step writes) the case names its file and the id is exact. Without it
    only the dotted ``classname`` is there, and the module ends before the first capitalised part (a test class).
    A collection error has no class name: its name is the dotted module.
    """
    classname, name = case.get("classname", ""), case.get("name", "")
    if not classname:
        return name.replace(".", "/") + ".py" if name and "/" not in name and "::" not in name else name
    parts = classname.split(".")
    split = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    file = case.get("file")
    if file and file.endswith(".py"):
        module = file[: -len(".py")].replace("/", ".").split(".")
        if parts[: len(module)] == module:
            split = len(module)
    else:
        file = "/".join(parts[:split]) + ".py"
    return "::".join([file, *parts[split:], name])


def test_counts(xml_path: Path) -> dict[str, Any]:
    """tests / passed / failures / errors / skipped of a pytest JUnit XML report, and the failing tests' ids."""
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    keys = ("tests", "failures", "errors", "skipped")
    counts: dict[str, Any] = {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    for key, tag in (("failed_ids", "failure"), ("error_ids", "error")):
        counts[key] = [_test_id(case) for case in root.iter("testcase") if case.find(tag) is not None]
    return counts


def benchmarks(bench_path: Path) -> list[dict[str, Any]]:
    """Each pytest-benchmark entry: its name, median seconds of a round and ``extra_info``."""
    data = json.loads(bench_path.read_text())
    return [
        {"name": b["name"], "round_median_s": b["stats"]["median"], "rounds": b["stats"]["rounds"], **b["extra_info"]}
        for b in data.get("benchmarks", [])
    ]


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The headline figures: TPS at k = 2 per provider and batch, stage shares at each batch, kernel rates, and the
    training steps (``"train"``: stage, kernels, batch, items/s, ms per step, peak memory)."""
    out: dict[str, Any] = {"e2e_k2": [], "stages": {}, "kernels": [], "train": []}
    keys = ("provider", "batch", "capture_memory", "tps_paper", "latency_s_per_batch", "mfu", "speedup_vs_eager_fp32")
    for entry in results.get("e2e", []):
        if entry.get("k") == 2 and "tps_paper" in entry:
            out["e2e_k2"].append({k: entry.get(k) for k in (*keys, "compile_s")})
    for entry in results.get("stages", []):
        out["stages"].setdefault(str(entry["batch"]), {})[entry["stage"]] = entry.get("ms_per_batch")
    for entry in results.get("kernels", []):
        keys = ("name", "seconds_per_call", "gbps", "bandwidth_fraction", "gflops", "tflops")
        out["kernels"].append({k: entry.get(k) for k in keys if k in entry})
    for entry in results.get("train", []):  # bench/test_train.py: one optimizer step, fused kernels against eager
        keys = ("stage", "kernels", "batch", "items_per_s", "ms_per_step", "peak_memory_gb")
        out["train"].append({k: entry.get(k) for k in keys})
    return out


def suite_summary(steps: list[dict[str, Any]], tests: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The whole-suite run in a few lines: counts, failing ids, seconds, whether pycocoevalcap was there, what was
    left out."""
    step = next((s for s in steps if s.get("step") == "suite"), None)
    if step is None:
        return None
    commands = {c["name"]: c for c in step.get("commands", [])}
    counts = tests.get("suite")
    run = commands.get("suite", {})
    coco = commands.get("pycocoevalcap")
    left_out = commands.get("authors_checkpoint")  # the script leaves tests/convert out without its checkpoint
    return {
        "counts": {k: counts[k] for k in ("passed", "failures", "errors", "skipped", "tests")} if counts else None,
        "failing": (counts["failed_ids"] + counts["error_ids"]) if counts else None,
        "seconds": run.get("seconds"),
        "exit_code": run.get("exit_code"),
        "timed_out": run.get("timed_out"),
        "pycocoevalcap": None if coco is None else {"present": coco["exit_code"] == 0, "detail": coco["command"]},
        "left_out": None if left_out is None else left_out["command"],
        "note": None if counts else "no JUnit report: the suite did not run or did not finish (see suite.log)",
    }


def assemble(parts: Path) -> dict[str, Any]:
    steps = [json.loads(p.read_text()) for p in sorted((parts / "steps").glob("*.json"))]
    results = {p.name.removesuffix(".bench.json"): benchmarks(p) for p in sorted(parts.glob("*.bench.json"))}
    tests = {p.stem: test_counts(p) for p in sorted(parts.glob("*.xml"))}
    tune = parts / "tune.json"
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "environment": environment(),
        "steps": steps,
        "commands": [s.get("command") for s in steps],
        "tests": tests,
        "missing": [name for name in STEPS if name not in {s.get("step") for s in steps}],
        "summary": {**summary(results), "suite": suite_summary(steps, tests)},
        "benchmarks": results,
        "tune": json.loads(tune.read_text()) if tune.is_file() else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", required=True, type=Path, help="the directory gpu_check.sh writes its parts to")
    parser.add_argument("--out", required=True, type=Path, help="the results JSON to write")
    args = parser.parse_args(argv)
    if not args.parts.is_dir():
        print(f"gpu_check_report: {args.parts} is not a directory", file=sys.stderr)
        return 2
    report = assemble(args.parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    print(f"gpu_check_report: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
