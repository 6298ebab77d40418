"""bench/gpu_tune.py on a CPU: argument handling, the deadline, failures, the tables (fakes stand in for the GPU)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from procap.fast import Captioner

ROOT = Path(__file__).resolve().parents[1]


def _tune():
    spec = importlib.util.spec_from_file_location("gpu_tune", ROOT / "bench" / "gpu_tune.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


tune = _tune()


def test_arguments_are_parsed_and_checked(capsys):
    args = tune.parse_args(["--variants", "baseline, all", "--batches", "32,1,32"])
    assert args.variants == ["baseline", "all"] and args.batches == [1, 32]
    assert args.profile_batches == [1, 32]  # every kernel at batch 1 as well as 32 unless told otherwise
    assert tune.parse_args([]).variants == list(tune.DEFAULT_VARIANTS)
    assert tune.parse_args(["--profile-batches", "0"]).profile_batches == []
    assert tune.parse_args(["--profile-batches", "8"]).profile_batches == [8]
    bad_lists = (["--variants", "baseline,fast"], ["--batches", "1,x"], ["--batches", "0"], ["--iters", "0"])
    for bad in (*bad_lists, ["--profile-batches", "-1"], ["--profile-batches", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            tune.parse_args(bad)
        assert exit_info.value.code == 2
    assert "unknown variant(s) fast" in capsys.readouterr().err


def test_every_variant_is_a_valid_captioner_configuration():
    accepted = set(inspect.signature(Captioner).parameters)
    for name, variant in tune.VARIANTS.items():
        assert set(variant.captioner) <= accepted, name
    assert tune.VARIANTS["all"].captioner == {}  # "all" is the Captioner's defaults, whatever they become


def test_default_variants_compare_the_defaults_with_the_measured_alternatives(capsys):
    assert tune.DEFAULT_VARIANTS[0] == "all"  # the token gate compares every variant with the Captioner's defaults
    assert set(tune.DEFAULT_VARIANTS) <= set(tune.VARIANTS)
    # the encoder's readable stack and the GELU epilogue are each "all" with one switch of fused_encoder
    assert tune.VARIANTS["readable_encoder"].captioner == {"fused_encoder": False}
    assert tune.VARIANTS["encoder_gelu_epilogue"].captioner["fused_encoder"]["gelu_epilogue"] is True
    assert tune.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "[estimate: -1.1 ms at b32]" in listed
    assert "[estimate: -0.25 ms at b32, -0.05 ms at b1]" in listed  # written before any GPU ran it


def test_the_logits_pick_variant_is_the_defaults_with_the_decoders_option():
    from procap.model.decoder import CaptionDecoder

    variant = tune.VARIANTS["decode_logits_pick"]
    assert variant.captioner == {"fused_decoder": {"logits_pick": True}}
    assert set(variant.captioner["fused_decoder"]) <= set(CaptionDecoder.fused_options)
    assert variant.estimate_ms_b32 is not None and variant.estimate_ms_b1 is not None


def test_the_split_k_variant_is_the_defaults_with_the_decoders_option(capsys):
    from procap.model.decoder import CaptionDecoder

    variant = tune.VARIANTS["decode_split_k"]
    assert variant.captioner == {"fused_decoder": {"split_k_attention": True}}
    assert set(variant.captioner["fused_decoder"]) <= set(CaptionDecoder.fused_options)
    assert tune.main(["--list"]) == 0
    assert "[estimate: -0.1 ms at b32, -0.15 ms at b1]" in capsys.readouterr().out  # written before any GPU ran it


def test_the_issue_51_fusions_are_variants_with_their_estimates(capsys):
    from procap.model.decoder import CaptionDecoder
    from procap.model.encoder import ProcedureEncoder

    mlp, erf = tune.VARIANTS["decode_mlp"], tune.VARIANTS["encoder_gelu_erf_epilogue"]
    assert mlp.captioner == {"fused_decoder": {"mlp": True}}
    assert set(mlp.captioner["fused_decoder"]) <= set(CaptionDecoder.fused_options)
    assert erf.captioner["fused_encoder"] == {"add_norm": True, "gelu_erf_epilogue": True}
    assert set(erf.captioner["fused_encoder"]) <= set(ProcedureEncoder.fused_options)
    assert tune.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "[estimate: -0.1 ms at b32, -0.2 ms at b1]" in listed  # written before any GPU ran them
    assert "[estimate: -0.55 ms at b32, -0.03 ms at b1]" in listed


def test_the_group_norm_variants_are_the_defaults_with_the_vqgans_option(capsys):
    from procap.kernels.groupnorm import GROUP_NORM_PATHS
    from procap.model.vqgan import VQGAN

    assert set(tune.GN_VARIANTS) <= set(tune.VARIANTS) and tune.GN_VARIANTS[0] == "all"
    for name, path in (("gn_persistent", "persistent"), ("gn_single_kernel", "single_kernel")):
        variant = tune.VARIANTS[name]
        assert variant.captioner == {"fused_vqgan": {"group_norm": path}} and path in GROUP_NORM_PATHS
        assert set(variant.captioner["fused_vqgan"]) <= set(VQGAN.fused_options)
    assert tune.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "[estimate: -1.45 ms at b32, -0.6 ms at b1]" in listed  # written before any GPU ran it
    assert "[estimate: -1.6 ms at b32, -0.7 ms at b1]" in listed


def test_the_conv_in_stats_variant_is_the_defaults_with_the_vqgans_option(capsys):
    from procap.model.vqgan import VQGAN

    variant = tune.VARIANTS["conv_in_stats"]
    assert variant.captioner == {"fused_vqgan": {"conv_in_stats": True}}
    assert set(variant.captioner["fused_vqgan"]) <= set(VQGAN.fused_options)
    assert tune.main(["--list"]) == 0
    assert "[estimate: -1.3 ms at b32, -0.04 ms at b1]" in capsys.readouterr().out  # written before any GPU ran it


def test_list_prints_the_variants_and_a_run_without_a_gpu_is_refused(capsys):
    assert tune.main(["--list"]) == 0
    assert "baseline" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert tune.main(["--variants", "baseline"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_deadline_stops_new_variants_and_a_failure_is_reported():
    now = [0.0]

    def measure(name):
        now[0] += 100.0  # each variant takes 100 s on the fake clock
        if name == "fold_bias":
            raise RuntimeError("CUDA error: out of memory\nmore lines")
        return {"batches": {"1": {"median_ms": 1.0}}}

    results, not_started = tune.run_variants(
        ["baseline", "fold_bias", "all", "whole_graph"], measure, deadline_s=150.0, clock=lambda: now[0]
    )
    assert list(results) == ["baseline", "fold_bias"] and not_started == ["all", "whole_graph"]
    assert results["fold_bias"] == {"error": "RuntimeError: CUDA error: out of memory"}


def test_time_calls_uses_the_timer_for_every_call():
    calls = []
    times = iter([3.0, 1.0, 2.0])
    assert tune.time_calls(lambda: calls.append(1), 3, lambda fn: (fn(), next(times))[1]) == [3.0, 1.0, 2.0]
    assert len(calls) == 3


def test_gate_measures():
    reference = torch.ones(4, 3)
    assert tune.relative_difference(reference * 1.01, reference) == pytest.approx(0.01)
    assert tune.token_match(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4])) == 0.75


def test_compact_table_has_one_line_per_variant_and_marks_what_is_missing():
    results = {
        "baseline": {
            "batches": {
                "1": {"median_ms": 7.561, "tps": 3174.0, "mfu": 0.018, "setup_s": 2.0},
                "32": {"median_ms": 51.6, "tps": 14883.7, "mfu": 0.232, "setup_s": 3.5, "sm_clock_mhz": 1755.2},
            },
            "memory_rel_diff": 0.0123,
            "token_match": 1.0,
        },
        "all": {
            "batches": {"32": {"median_ms": 30.25, "tps": 25388.0, "mfu_fp8_peak": 0.116}},
            "memory_rel_diff": None,
        },
        "compile": {"error": "RuntimeError: boom"},
    }
    lines = tune.compact_table(results, [1, 32]).splitlines()
    assert lines[0].split() == [
        "variant",
        "b1",
        "ms",
        "b32",
        "ms",
        "b32",
        "TPS",
        "MFU",
        "MFU",
        "fp8",
        "SM",
        "MHz",
        "mem",
        "rel",
        "tokens",
        "setup",
        "s",
    ]
    assert lines[1].split() == ["baseline", "7.56", "51.60", "14,884", "23.2%", "-", "1755", "1.2e-02", "100.0%", "5.5"]
    assert lines[2].split() == ["all", "-", "30.25", "25,388", "-", "11.6%", "-", "-", "-", "-"]
    assert lines[3].split()[:2] == ["compile", "failed:"] and "boom" in lines[3]
    assert len({len(line.rstrip()) for line in lines[:3]}) == 1  # aligned columns


def _recorded_averages():
    """torch.profiler ``key_averages()`` rows as recorded on the H100 (bench/results/h100-2026-11-26-run2.json, the
    ``all`` variant's batch-32 call), with the CPU-side rows a trace also holds: ops whose row carries the time of
    the kernels they launched, and host-only ops."""
    from torch.autograd import DeviceType

    recorded = json.loads((ROOT / "bench" / "results" / "h100-2026-11-26-run2.json").read_text())
    kernels = recorded["variants"]["call_2"]["all"]["top_kernels"]
    rows = [
        SimpleNamespace(
            key=k["name"],
            device_type=DeviceType.CUDA,
            self_device_time_total=k["ms_per_call"] * 1e3,
            count=k["launches_per_call"],
        )
        for k in kernels
    ]
    rows.insert(0, SimpleNamespace(key="tiny_kernel", device_type=DeviceType.CUDA, self_device_time_total=0.9, count=1))
    rows.append(SimpleNamespace(key="aten::addmm", device_type=DeviceType.CPU, self_device_time_total=4182.2, count=63))
    rows.append(SimpleNamespace(key="cudaGraphLaunch", device_type=DeviceType.CPU, self_device_time_total=0.0, count=1))
    return rows, kernels


def test_every_recorded_kernel_is_listed_longest_first_and_cpu_rows_are_not_kernels():
    rows, recorded = _recorded_averages()
    listed = tune.kernel_list(rows)
    names = [k["name"] for k in listed["kernels"]]
    assert names[-1] == "tiny_kernel" and len(names) == len(recorded) + 1  # no cut, however short
    assert "aten::addmm" not in names and "cudaGraphLaunch" not in names  # counted once, as kernels
    assert names[:3] == [k["name"] for k in recorded[:3]]
    times = [k["ms_per_call"] for k in listed["kernels"]]
    assert times == sorted(times, reverse=True)
    assert listed["device_ms"] == pytest.approx(sum(k["ms_per_call"] for k in recorded) + 0.0009)
    assert listed["launches"] == sum(k["launches_per_call"] for k in recorded) + 1
    halved = tune.kernel_list(rows, calls=2)  # two profiled calls: per call
    assert halved["device_ms"] == pytest.approx(listed["device_ms"] / 2)


def test_kernel_table_prints_the_top_and_sums_the_rest():
    rows, _ = _recorded_averages()
    text = tune.kernel_table("all", 32, tune.kernel_list(rows), top=2).splitlines()
    assert text[0].startswith("kernels, all, b32: ") and "launches" in text[0]
    assert text[1].split()[:3] == ["9.133", "ms", "27x"] and len(text) == 4
    assert text[3].endswith("more kernels (every one in the results JSON)")


def test_the_sm_clock_is_recorded_beside_each_batch_or_its_absence_said_once():
    summary = {"sm_clock_mhz_mean": 1700.0, "sm_clock_mhz_min": 1590.0, "sm_clock_max_mhz": 1980.0, "power_w_mean": 650}
    fields = tune.clock_fields(summary)
    assert fields == {"sm_clock_mhz": 1700.0, "sm_clock_mhz_min": 1590.0, "sm_clock_max_mhz": 1980.0, "power_w": 650}
    assert tune.clock_fields(None) == {"sm_clock_mhz": None}  # no nvidia-ml-py
    with_clock = {"all": {"batches": {"32": {"median_ms": 1.0, **fields}}}, "broken": {"error": "x"}}
    assert not tune.clocks_missing(with_clock)
    assert tune.clocks_missing({"all": {"batches": {"1": {"median_ms": 1.0, "sm_clock_mhz": None}}}})
    assert "nvidia-ml-py" in tune.NO_NVML


def test_the_issue_51_end_point_is_every_option_of_the_rounds_variants():
    """``issue51_all`` must hold each issue-51 variant's options (a variant added to the round and not to the end
    point, or an option spelled differently, fails here); ``--variants issue51`` expands to the round."""
    combined = tune.VARIANTS["issue51_all"].captioner
    for name in tune.ISSUE_51_VARIANTS:
        if name in ("all", "compile", "issue51_all", "gn_persistent"):  # the baseline, the reference, itself, a subset
            continue
        for choice, options in tune.VARIANTS[name].captioner.items():
            assert set(options.items()) <= set(combined[choice].items()), (name, choice)
    args = tune.parse_args(["--variants", "issue51,all"])
    assert args.variants == list(tune.ISSUE_51_VARIANTS)
    assert not set(tune.VARIANT_GROUPS) & set(tune.VARIANTS)
