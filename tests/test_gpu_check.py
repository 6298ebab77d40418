"""bench/gpu_check.sh and its report: argument handling, refusing to run without a GPU, the results in $OUT, the
step deadline, one assembled results JSON.

The full CPU dry run (``bash bench/gpu_check.sh --dry-run all``: extension build, tests and every benchmark suite at
CPU shapes) takes minutes, so it is run by hand (docs/gpu.md), not here; the ``profile`` step's dry run is quick.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _report_module():
    spec = importlib.util.spec_from_file_location("gpu_check_report", ROOT / "bench" / "gpu_check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bash(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False)


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


def test_bad_arguments_exit_2_with_one_sentence():
    done = _bash("benchmarks")
    assert done.returncode == 2 and "unknown argument 'benchmarks'" in done.stderr
    done = _bash()
    assert done.returncode == 2 and "name a step" in done.stderr


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="checks the refusal on a machine without GPU")
def test_refuses_a_gpu_run_without_a_gpu(tmp_path):
    done = _bash("--out", str(tmp_path), "e2e")
    assert done.returncode == 2 and "--dry-run" in done.stderr


def _dry_run_profile(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_CARRY": str(tmp_path / "carry"), "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "profile"], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_results_go_to_out_as_few_files(tmp_path):
    done = _dry_run_profile(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"  # $OUT: the only folder a lent machine sends back, at most 8 files
    # plus the built extension when the checkout has one (pip install -e builds it in place), carried to later calls
    built = sorted(p.name for p in (Path(__file__).parents[1] / "kernels").glob("_C*.so"))
    assert sorted(p.name for p in out.iterdir()) == sorted(["caches.tgz", "parts.tgz", "result.json", *built])
    report = json.loads((out / "result.json").read_text())
    assert [s["step"] for s in report["steps"]] == ["profile"] and report["steps"][0]["ok"]
    assert report["missing"] == ["setup", "e2e", "kernels"]
    with tarfile.open(out / "parts.tgz") as parts:
        names = {Path(n).as_posix().lstrip("./") for n in parts.getnames()}
    assert {"steps/profile.json", "tune.log"} <= names
    assert (tmp_path / "carry" / "cache" / "triton").is_dir()  # the caches live in the carried folder


def test_the_step_deadline_skips_what_does_not_fit_and_still_reports(tmp_path):
    done = _dry_run_profile(tmp_path, STEP_DEADLINE="10")  # less than the report's reserve: nothing may start
    assert done.returncode == 1 and "deadline" in done.stdout
    report = json.loads((tmp_path / "out" / "result.json").read_text())
    (command,) = report["steps"][0]["commands"]
    assert command["timed_out"] and command["command"].startswith("skipped (deadline)")


def test_report_assembles_the_parts(tmp_path):
    (tmp_path / "steps").mkdir()
    step = {
        "step": "setup",
        "command": "bash bench/gpu_check.sh setup",
        "ok": True,
        "commands": [{"name": "tests", "command": "pytest tests", "exit_code": 0, "seconds": 3.0}],
    }
    (tmp_path / "steps" / "setup.json").write_text(json.dumps(step))
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"></testsuite></testsuites>'
    )
    bench = {
        "benchmarks": [
            {
                "name": "test_e2e_fast[2-32]",
                "stats": {"median": 0.01, "rounds": 10},
                "extra_info": {"k": 2, "batch": 32, "provider": "fast", "tps_paper": 76800.0},
            }
        ]
    }
    (tmp_path / "e2e.bench.json").write_text(json.dumps(bench))
    out = tmp_path / "result.json"
    assert _report_module().main(["--parts", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["environment"]["torch"] == torch.__version__ and "device" in report["environment"]
    assert report["commands"] == ["bash bench/gpu_check.sh setup"] and report["date"]
    assert report["tests"]["tests"] == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2}
    assert report["missing"] == ["e2e", "kernels", "profile"] and report["tune"] is None
    assert report["summary"]["e2e_k2"][0]["tps_paper"] == 76800.0
    assert not list(tmp_path.glob("*.tmp"))


def test_report_refuses_a_missing_parts_directory(tmp_path):
    assert _report_module().main(["--parts", str(tmp_path / "nope"), "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()


def test_report_runs_as_a_script(tmp_path):
    (tmp_path / "steps").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check_report.py"),
            "--parts",
            str(tmp_path),
            "--out",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["missing"] == ["setup", "e2e", "kernels", "profile"]
