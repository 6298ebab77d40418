"""bench/gpu_check.sh and its report: argument handling, refusing to run without a GPU, the results in $OUT, the
step deadline, one assembled results JSON.

The full CPU dry run (``bash bench/gpu_check.sh --dry-run all``: the compiled ops, tests and every benchmark suite at
CPU shapes) takes minutes, so it is run by hand (docs/gpu.md), not here; the ``profile`` and ``suite`` steps' dry
runs are quick (``suite`` runs two small test files there, or the files a test names).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
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
    assert sorted(p.name for p in out.iterdir()) == ["caches.tgz", "parts.tgz", "result.json"]
    report = json.loads((out / "result.json").read_text())
    assert [s["step"] for s in report["steps"]] == ["profile"] and report["steps"][0]["ok"]
    assert report["missing"] == ["setup", "e2e", "kernels", "train", "ncu", "suite"]
    with tarfile.open(out / "parts.tgz") as parts:
        names = {Path(n).as_posix().lstrip("./") for n in parts.getnames()}
    assert {"steps/profile.json", "tune.log"} <= names
    assert (tmp_path / "carry" / "cache" / "triton").is_dir()  # the caches live in the carried folder


def test_the_ncu_step_is_prepared_for_the_group_norm_kernels(tmp_path):
    env = {**os.environ, "GPU_CHECK_CARRY": str(tmp_path / "carry"), "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "ncu"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    named = [line.split("[ncu] ", 1)[1].split(": ", 1) for line in done.stdout.splitlines() if "[ncu]" in line]
    lines = dict(named)
    assert set(lines) == {"gn_stats_b32", "gn_finalize_b1"}
    sections = "--section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats"
    for name, kernel, batch in (("gn_stats_b32", "stats", 32), ("gn_finalize_b1", "finalize", 1)):
        line = lines[name]
        assert line.startswith("ncu --clock-control none " + sections)
        assert f"-k regex:_group_norm_{kernel}_kernel --launch-count 1" in line
        assert line.endswith(f"-m procap profile --preset clevr --batch-size {batch} --steps 1 --no-trace --no-graphs")
    report = json.loads((tmp_path / "out" / "result.json").read_text())
    assert [c["name"] for c in report["steps"][0]["commands"]] == ["gn_stats_b32", "gn_finalize_b1"]


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
    train = {"stage": "stage1", "kernels": "fused", "batch": 8, "items_per_s": 120.0, "ms_per_step": 66.7}
    train_bench = {
        "benchmarks": [{"name": "test_train_step", "stats": {"median": 0.07, "rounds": 10}, "extra_info": train}]
    }
    (tmp_path / "train.bench.json").write_text(json.dumps(train_bench))
    out = tmp_path / "result.json"
    assert _report_module().main(["--parts", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["environment"]["torch"] == torch.__version__ and "device" in report["environment"]
    assert report["commands"] == ["bash bench/gpu_check.sh setup"] and report["date"]
    counts = {"tests": 5, "failures": 1, "errors": 0, "skipped": 2, "passed": 2, "failed_ids": [], "error_ids": []}
    assert report["tests"]["tests"] == counts
    assert report["missing"] == ["e2e", "kernels", "train", "profile", "ncu", "suite"] and report["tune"] is None
    assert report["summary"]["suite"] is None  # no suite step ran
    assert report["summary"]["e2e_k2"][0]["tps_paper"] == 76800.0
    assert report["summary"]["train"] == [{**train, "peak_memory_gb": None}]
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
    assert json.loads((tmp_path / "r.json").read_text())["missing"] == [
        "setup",
        "e2e",
        "kernels",
        "train",
        "profile",
        "ncu",
        "suite",
    ]


def test_report_names_failing_tests_by_their_pytest_ids(tmp_path):
    # xunit1 cases name their file; without it the module ends before the first capitalised part (a class)
    xml = """<testsuites><testsuite tests="5" failures="3" errors="1" skipped="0">
      <testcase classname="tests.fast.test_cli" file="tests/fast/test_cli.py" name="test_a[x.y]"><failure/></testcase>
      <testcase classname="tests.test_k.TestK" file="tests/test_k.py" name="test_m"><failure/></testcase>
      <testcase classname="tests.test_k.TestK" name="test_n"><failure/></testcase>
      <testcase classname="" name="tests.broken"><error/></testcase>
      <testcase classname="tests.test_k" name="test_ok"/>
    </testsuite></testsuites>"""
    (tmp_path / "suite.xml").write_text(xml)
    counts = _report_module().test_counts(tmp_path / "suite.xml")
    assert counts["passed"] == 1 and counts["error_ids"] == ["tests/broken.py"]
    assert counts["failed_ids"] == [
        "tests/fast/test_cli.py::test_a[x.y]",
        "tests/test_k.py::TestK::test_m",
        "tests/test_k.py::TestK::test_n",
    ]


def _wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal pure-Python wheel (what pip needs: METADATA, WHEEL and a RECORD with hashes)."""
    info = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _dry_run_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_CARRY": str(tmp_path / "carry"), "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "suite"], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_suite_dry_run_installs_the_carried_wheels_and_counts_the_tests(tmp_path):
    _wheel(tmp_path / "whl", "gpu_check_probe", {"gpu_check_probe/__init__.py": "VALUE = 7\n"})
    # a wheel of an installed distribution is left alone: on PYTHONPATH it would shadow the installed one
    _wheel(tmp_path / "whl", "pytest", {"gpu_check_shadow/__init__.py": ""})
    tests = tmp_path / "test_probe.py"  # one of each outcome; the passing test needs the carried wheel
    tests.write_text(
        textwrap.dedent(
            """
            import pytest

            def test_wheel_is_importable():
                import gpu_check_probe
                assert gpu_check_probe.VALUE == 7

            def test_fails():
                assert False

            def test_skips():
                pytest.skip("on purpose")

            @pytest.fixture
            def broken():
                raise RuntimeError("on purpose")

            def test_errors(broken):
                pass
            """
        )
    )
    site = tmp_path / "site"
    done = _dry_run_suite(
        tmp_path, GPU_CHECK_WHEELS=str(tmp_path / "whl"), GPU_CHECK_SITE=str(site), GPU_CHECK_SUITE_TESTS=str(tests)
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a failing test fails the step
    assert (site / "gpu_check_probe" / "__init__.py").is_file() and not (site / "gpu_check_shadow").exists()
    assert "pytest-1.0-py3-none-any.whl not used" in done.stderr
    report = json.loads((tmp_path / "out" / "result.json").read_text())
    assert report["missing"] == ["setup", "e2e", "kernels", "train", "profile", "ncu"]
    suite = report["summary"]["suite"]
    assert suite["counts"] == {"passed": 1, "failures": 1, "errors": 1, "skipped": 1, "tests": 4}
    # ids are relative to pytest's rootdir, which for a probe outside the checkout depends on where tmp_path lies
    assert [test_id.rsplit("/", 1)[-1] for test_id in suite["failing"]] == [
        "test_probe.py::test_fails",
        "test_probe.py::test_errors",
    ]
    assert suite["exit_code"] == 1 and suite["pycocoevalcap"]["present"]  # this machine has it (the eval extra)
    names = [c["name"] for c in report["steps"][0]["commands"]]
    assert names == ["wheels", "pycocoevalcap", "suite"]
    suite_command = report["steps"][0]["commands"][-1]["command"]
    assert "--deselect tests/test_demo.py::test_quick_demo_end_to_end" in suite_command and " -n " not in suite_command
    with tarfile.open(tmp_path / "out" / "parts.tgz") as parts:
        names = {Path(n).as_posix().lstrip("./") for n in parts.getnames()}
    assert {"suite.xml", "suite.log", "wheels.log", "steps/suite.json"} <= names


def test_suite_dry_run_says_when_pycocoevalcap_is_missing(tmp_path):
    block = tmp_path / "block"  # a sitecustomize that hides pycocoevalcap, as on the GPU image without the wheel
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys\n\nsys.modules['pycocoevalcap'] = None\n")
    tests = tmp_path / "test_one.py"
    tests.write_text("def test_one():\n    pass\n")
    done = _dry_run_suite(
        tmp_path,
        PYTHONPATH=str(block),
        GPU_CHECK_WHEELS=str(tmp_path / "none"),
        GPU_CHECK_SUITE_TESTS=str(tests),
    )
    assert done.returncode == 1 and "pycocoevalcap is MISSING" in done.stdout, done.stdout + done.stderr
    suite = json.loads((tmp_path / "out" / "result.json").read_text())["summary"]["suite"]
    assert suite["pycocoevalcap"]["present"] is False and "missing" in suite["pycocoevalcap"]["detail"]
    assert suite["counts"]["passed"] == 1 and suite["failing"] == []


def test_suite_dry_run_default_selection(tmp_path):
    done = _dry_run_suite(tmp_path, GPU_CHECK_WHEELS=str(tmp_path / "none"))
    assert done.returncode == 0, done.stdout + done.stderr
    suite = json.loads((tmp_path / "out" / "result.json").read_text())["summary"]["suite"]
    assert suite["counts"]["failures"] == suite["counts"]["errors"] == 0 and suite["counts"]["passed"] > 1
