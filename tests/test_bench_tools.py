"""bench/bf16_agreement.py's agreement measure and bench/e2e_table.py's table, on hand-made inputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from procap.model.decoder import EOS_ID, PAD_ID

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agreement_counts_tokens_up_to_the_oracles_eos():
    agreement = _module("bf16_agreement").agreement
    oracle = torch.tensor([[10, 11, EOS_ID, PAD_ID, PAD_ID], [10, 12, 13, EOS_ID, PAD_ID], [9, 9, 9, 9, 9]])
    fast = torch.tensor([[10, 11, EOS_ID, PAD_ID, PAD_ID], [10, 14, 13, EOS_ID, PAD_ID], [9, 9, 9, 9, 8]])
    result = agreement(fast, oracle)
    # 3/3 + 3/4 + 4/5 counted tokens equal (the third row has no EOS: all 5 count).
    assert result["token_agreement"] == pytest.approx(10 / 12)
    assert result["caption_agreement"] == pytest.approx(1 / 3)
    # First divergence: none, at 1 of 4, at 4 of 5.
    assert result["prefix_fraction"] == pytest.approx((1 + 1 / 4 + 4 / 5) / 3)
    assert agreement(oracle, oracle) == {
        "pairs": 3,
        "token_agreement": 1.0,
        "caption_agreement": 1.0,
        "prefix_fraction": 1.0,
    }


def test_agreement_ignores_what_follows_the_oracles_eos():
    agreement = _module("bf16_agreement").agreement
    oracle = torch.tensor([[10, EOS_ID, PAD_ID]])
    fast = torch.tensor([[10, EOS_ID, 17]])  # cannot happen (PAD after EOS), but must not count
    assert agreement(fast, oracle)["token_agreement"] == 1.0


def test_agreement_script_refuses_without_a_gpu_or_with_both_sources(tmp_path, capsys):
    main = _module("bf16_agreement").main
    assert main(["--random-preset", "tiny", "--checkpoint", "x", "--out", str(tmp_path / "a.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err or torch.cuda.is_available()


def test_e2e_table_prints_one_row_per_run(tmp_path, capsys):
    table = _module("e2e_table")
    runs = [
        {"extra_info": {"provider": "fast", "k": 2, "batch": 32, "tps_paper": 14876.2, "mfu": 0.23}},
        {"extra_info": {"provider": "eager_fp32", "k": 2, "batch": 32, "tps_paper": 2020.4}},
        {"extra_info": {"name": "a kernel benchmark, no TPS"}},
    ]
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"benchmarks": runs}))
    assert table.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("eager_fp32 | 2 | 32") and "14876" in lines[2]
    assert table.main([str(tmp_path / "missing.json")]) == 2
