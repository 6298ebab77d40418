"""Interpolation quality and speed on synthetic "move" pairs: flow interpolator vs cross-fade.

PSNR against the generator's rendered ground-truth midpoint goes into ``benchmark.extra_info`` (and is
printed), next to the time per pair. Run: ``pytest bench/test_interpolation.py --benchmark-only -s``.
"""

from __future__ import annotations

import pytest
from conftest import device_info

from procap.procedure.interpolate import CrossFade, FlowInterpolator
from procap.procedure.quality import evaluate_interpolators, load_truth, psnr

SCENES = 100  # 20 move pairs: the generator cycles through the five change types


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    from procap.data.synthetic import generate

    root = tmp_path_factory.mktemp("synth")
    generate(root, SCENES, size=64, seed=0, progress=False)
    return root


@pytest.mark.parametrize("name", ["flow", "crossfade"])
def test_midpoint_quality(benchmark, synth_root, name, bench_device):
    interp = FlowInterpolator(device=bench_device) if name == "flow" else CrossFade()
    before, after, truth = load_truth(synth_root, "move")
    before, after = before.to(bench_device), after.to(bench_device)
    mids = benchmark(lambda: interp(before, after).cpu())
    quality = evaluate_interpolators(synth_root, {name: interp}, "move")[name]
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(
        {
            "pairs": int(before.shape[0]),
            "size": 64,
            "psnr_db": quality["psnr"],
            "psnr_changed_db": quality["psnr_changed"],
        }
    )
    print(
        f"\n{name}: PSNR {quality['psnr']:.2f} dB (changed region {quality['psnr_changed']:.2f} dB) "
        f"on {before.shape[0]} move pairs"
    )
    assert float(psnr(mids, truth).mean()) == pytest.approx(quality["psnr"], abs=1e-3)


def test_flow_beats_crossfade_on_moves(synth_root):
    result = evaluate_interpolators(synth_root, change_type="move")
    # the acceptance bar: clearly better than a cross-fade where objects move
    assert result["flow"]["psnr"] > result["crossfade"]["psnr"] + 2.0
    assert result["flow"]["psnr_changed"] > result["crossfade"]["psnr_changed"] + 2.0


@pytest.mark.parametrize("change_type", ["color", "material", "add", "drop"])
def test_flow_invents_no_motion(synth_root, change_type):
    # Without motion the true midpoint is a blend: the flow interpolator must stay close to it.
    result = evaluate_interpolators(synth_root, change_type=change_type)
    print(f"\n{change_type}: flow {result['flow']['psnr']:.2f} dB, cross-fade {result['crossfade']['psnr']:.2f} dB")
    assert result["flow"]["psnr"] > 35.0


@pytest.mark.parametrize("mode", ["recursive", "direct"])
def test_procedure_quality(benchmark, synth_root, mode):
    """Whole l = 7 procedures: the paper's recursive midpoints vs all frames from one flow."""
    from procap.procedure.interpolate import generate_procedure
    from procap.procedure.quality import evaluate_procedures

    before, after, _ = load_truth(synth_root, "move")
    interp = FlowInterpolator()
    benchmark(lambda: generate_procedure(before, after, interp, 7, direct=mode == "direct"))
    result = evaluate_procedures(synth_root, 7, "move", interpolators={"flow": interp, "crossfade": CrossFade()})
    ours, fade = result[f"flow/{mode}"], result["crossfade/recursive"]
    benchmark.extra_info.update(
        {
            "pairs": ours["pairs"],
            "psnr_db": ours["psnr"],
            "per_frame_db": ours["per_frame"],
            "crossfade_psnr_db": fade["psnr"],
        }
    )
    print(
        f"\nflow/{mode}: {ours['psnr']:.2f} dB over 7 frames (cross-fade {fade['psnr']:.2f} dB), "
        f"per frame {[round(v, 1) for v in ours['per_frame']]}"
    )
    assert ours["psnr"] > fade["psnr"] + 1.5
