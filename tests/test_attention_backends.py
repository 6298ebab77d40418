"""bench/attention_backends.py on a CPU: its dry run, the order it reads from results, and ``auto`` taking it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from procap.kernels import attention as attn_mod
from procap.kernels.attention import SAFE_ORDER, select_backend

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("attention_backends", ROOT / "bench" / "attention_backends.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


bench = _bench()


def _timed(ms: float) -> dict:
    return {"max_abs_error": 0.0, "ok": True, "median_ms": ms}


def _recorded() -> dict:
    """A results file in the bench's format, its figures invented for the test (no GPU measured them): on "cpu",
    math is fastest on both encoder shapes, sdpa on the decode ones; flash ran one encoder shape only, sdpa_cudnn was
    wrong, and split_k and flash3 beat every backend on the cross attention (no backends: never in the order)."""
    encoder = {"use": "encoder", "batch": 1, "heads": 4, "queries": 90, "keys": 90, "head_dim": 32, "masked": False}
    cross = {**encoder, "use": "decode", "queries": 1}
    return {
        "device": "cpu",
        "architecture": "cpu",
        "dtype": "bfloat16",
        "timings": {
            "encoder_b1": {
                "shape": encoder,
                "backends": {
                    "sdpa": _timed(2.0),
                    "math": _timed(1.0),
                    "flash": _timed(0.5),
                    "xformers": {"skipped": "no"},
                },
            },
            "encoder_b32": {
                "shape": {**encoder, "batch": 32},
                "backends": {"sdpa": _timed(30.0), "math": _timed(20.0), "flash": {"error": "RuntimeError: boom"}},
            },
            "decode_cross_b1": {
                "shape": cross,
                "backends": {
                    "sdpa": _timed(0.01),
                    "math": _timed(0.03),
                    "sdpa_cudnn": {"max_abs_error": 1.0, "ok": False},
                    "split_k": _timed(0.005),
                    "flash3": _timed(0.008),
                },
            },
        },
    }


def test_the_order_ranks_the_backends_that_passed_every_shape_of_a_use():
    results = _recorded()
    assert bench.measured_order(results, "encoder") == ["math", "sdpa"]  # flash failed one shape: unranked
    assert bench.measured_order(results, "decode") == ["sdpa", "math"]  # no split_k, flash3, wrong sdpa_cudnn
    lines = bench.order_lines(results, "recorded.json")
    assert "    ('cpu', 'encoder'): ('math', 'sdpa',)," in lines
    assert "    ('cpu', 'decode'): ('sdpa', 'math',)," in lines
    assert "    # decode_cross_b1: split_k 0.0050 ms, flash3 0.0080 ms, best backend sdpa 0.0100 ms" in lines


def test_a_recorded_result_changes_what_auto_chooses(monkeypatch):
    monkeypatch.setattr(attn_mod, "_auto_cache", {})
    monkeypatch.delenv("PROCAP_ATTENTION", raising=False)
    monkeypatch.setattr(attn_mod, "MEASURED_ORDER", {})
    assert select_backend("cpu", torch.float32) == "sdpa"  # the safe order, nothing measured
    # the documented step: the --order-from lines pasted into MEASURED_ORDER
    table = ast.literal_eval("{\n" + "\n".join(bench.order_lines(_recorded(), "recorded.json")) + "\n}")
    monkeypatch.setattr(attn_mod, "MEASURED_ORDER", table)
    attn_mod._auto_cache.clear()
    assert select_backend("cpu", torch.float32) == "math"
    assert select_backend("cpu", torch.float32, "decode") == "sdpa"
    assert attn_mod.auto_order("sm90", "encoder") == SAFE_ORDER  # a GPU nothing was measured on: the safe order


def test_order_from_prints_the_entries(tmp_path, capsys):
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(_recorded()))
    assert bench.main(["--order-from", str(path)]) == 0
    assert "('cpu', 'encoder'): ('math', 'sdpa',)," in capsys.readouterr().out


def test_bad_arguments_exit_2():
    for bad in (["--batches", "1,x"], ["--batches", "0"], ["--iters", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args(bad)
        assert exit_info.value.code == 2
    assert bench.parse_args(["--dry-run"]).batches == [1, 2] and bench.parse_args([]).batches == [1, 32]


def test_the_dry_run_times_every_backend_on_the_cpu(tmp_path):
    out = tmp_path / "attention.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "bench/attention_backends.py", "--dry-run", "--iters", "1", "--batches", "1"]
    cmd += ["--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["architecture"] == "cpu" and results["preset"] == "tiny"
    assert set(results["timings"]) == {"encoder_b1", "decode_cross_b1", "decode_self_b1"}
    for name, entry in results["timings"].items():
        for backend, result in entry["backends"].items():
            assert "skipped" in result or "error" in result or "max_abs_error" in result, (name, backend)
        assert entry["backends"]["math"]["ok"] and entry["backends"]["sdpa"]["median_ms"] > 0
        assert entry["backends"]["flash"].get("skipped") or entry["backends"]["flash"].get("runs") == "sdpa"
    assert results["timings"]["decode_cross_b1"]["backends"]["split_k"]["ok"]  # the interpreter ran the kernels
    assert "split_k" not in results["timings"]["decode_self_b1"]["backends"]  # the masked call is not split-K's
    assert "skipped" in results["timings"]["encoder_b1"]["backends"]["flash3"]  # flash-attn 3 needs a GPU
    assert set(results["order"]["encoder"]) >= {"sdpa", "math"} and "split_k" not in results["order"]["decode"]
    assert "('cpu', 'encoder'): (" in done.stdout
