import itertools
import json

import numpy as np
import pytest
from PIL import Image

from procap.core.config import VIEWPOINTS
from procap.core.errors import ProCapError
from procap.data.synthetic import generate, make_scene, render_intermediate, render_state


def _read(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_generation_is_deterministic_for_a_seed(tmp_path):
    generate(tmp_path / "a", scenes=6, size=32, seed=5, progress=False)
    generate(tmp_path / "b", scenes=6, size=32, seed=5, progress=False)
    generate(tmp_path / "c", scenes=6, size=32, seed=6, progress=False)
    for name in ("change_captions.json", "splits.json", "type_mapping.json"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    same = _read(tmp_path / "a/images/CLEVR_default_000003.png")
    assert np.array_equal(same, _read(tmp_path / "b/images/CLEVR_default_000003.png"))
    assert not np.array_equal(same, _read(tmp_path / "c/images/CLEVR_default_000003.png"))


def test_layout_matches_clevr_change(tmp_path):
    generate(tmp_path, scenes=10, size=32, seed=0, progress=False)
    for sub, name in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
        assert (tmp_path / sub / f"CLEVR_{name}_000009.png").is_file()
    splits = json.loads((tmp_path / "splits.json").read_text())
    assert sorted(i for v in splits.values() for i in v) == list(range(10))
    mapping = json.loads((tmp_path / "type_mapping.json").read_text())
    assert set(mapping) == {"color", "material", "add", "drop", "move"}
    assert all(name.endswith(".png") and len(name) == 10 for names in mapping.values() for name in names)
    captions = json.loads((tmp_path / "change_captions.json").read_text())
    assert all(len(v) >= 2 for v in captions.values())


def test_distractor_differs_but_semantic_change_is_visible(tmp_path):
    generate(tmp_path, scenes=5, size=48, seed=1, progress=False)
    before = _read(tmp_path / "images/CLEVR_default_000000.png").astype(int)
    after = _read(tmp_path / "sc_images/CLEVR_semantic_000000.png").astype(int)
    distractor = _read(tmp_path / "nsc_images/CLEVR_nonsemantic_000000.png").astype(int)
    assert np.abs(before - after).max() > 25  # a whole object changes
    assert np.abs(before - distractor).mean() > 0


def test_render_intermediate_endpoints_equal_the_images(tmp_path):
    generate(tmp_path, scenes=5, size=32, seed=2, progress=False)
    for index in range(5):
        start, end = render_intermediate(tmp_path, index, 0.0), render_intermediate(tmp_path, index, 1.0)
        assert np.array_equal(start, _read(tmp_path / f"images/CLEVR_default_{index:06d}.png"))
        assert np.array_equal(end, _read(tmp_path / f"sc_images/CLEVR_semantic_{index:06d}.png"))
        middle = render_intermediate(tmp_path, index, 0.5)
        assert middle.shape == start.shape and not np.array_equal(middle, start)


def test_each_change_type_interpolates_as_specified(tmp_path):
    # Scene i has type CHANGE_TYPES[i % 5]: color, material, add, drop, move.
    generate(tmp_path, scenes=5, size=32, seed=4, progress=False)
    scenes = json.loads((tmp_path / "scenes.json").read_text())["scenes"]
    assert [s["change"]["type"] for s in scenes] == ["color", "material", "add", "drop", "move"]
    for index in range(5):
        frames = [render_intermediate(tmp_path, index, t).astype(float) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
        to_end = [np.abs(f - frames[-1]).mean() for f in frames]
        assert all(a > b for a, b in itertools.pairwise(to_end)), (index, to_end)  # moves steadily to the after state
    # colour blend: the midpoint lies between the endpoints pixel-wise (up to rounding)
    a, m, b = (render_intermediate(tmp_path, 0, t).astype(int) for t in (0.0, 0.5, 1.0))
    assert np.all(m >= np.minimum(a, b) - 1) and np.all(m <= np.maximum(a, b) + 1)


def test_captions_name_the_changed_object(tmp_path):
    generate(tmp_path, scenes=5, size=32, seed=7, progress=False)
    scenes = json.loads((tmp_path / "scenes.json").read_text())["scenes"]
    captions = json.loads((tmp_path / "change_captions.json").read_text())
    no_change = json.loads((tmp_path / "no_change_captions.json").read_text())
    for scene in scenes:
        change = scene["change"]
        obj = change["object"] if change["type"] == "add" else scene["objects"][change["target"]]
        name = f"{obj['size']} {obj['color']} {obj['material']} {obj['shape']}"
        caps = captions[f"CLEVR_default_{scene['index']:06d}.png"]
        assert len(set(caps)) == len(caps) >= 3 and all(name in c for c in caps)
        assert len(no_change[f"CLEVR_default_{scene['index']:06d}.png"]) >= 3


def test_workers_do_not_change_the_output(tmp_path):
    generate(tmp_path / "one", scenes=30, size=16, seed=1, progress=False)
    generate(tmp_path / "two", scenes=30, size=16, seed=1, workers=2, progress=False)
    for name in ("scenes.json", "change_captions.json", "splits.json"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()
    assert np.array_equal(
        _read(tmp_path / "one/sc_images/CLEVR_semantic_000029.png"),
        _read(tmp_path / "two/sc_images/CLEVR_semantic_000029.png"),
    )


def test_render_intermediate_rejects_bad_input(tmp_path):
    with pytest.raises(ProCapError, match="scenes.json"):
        render_intermediate(tmp_path, 0, 0.5)
    generate(tmp_path, scenes=1, size=16, seed=0, progress=False)
    with pytest.raises(ProCapError, match="t must be"):
        render_intermediate(tmp_path, 0, 1.5)
    with pytest.raises(ProCapError, match="scene 3"):
        render_intermediate(tmp_path, 3, 0.5)


@pytest.mark.parametrize(
    ("arguments", "name"),
    [({"scenes": 10**10}, "scenes"), ({"scenes": "4"}, "scenes"), ({"size": 10**6}, "size"), ({"seed": 2**70}, "seed")],
)
def test_generate_bounds_its_multipliers_before_allocating(tmp_path, arguments, name):
    """The scene indices are listed before any image is drawn: 10**10 scenes took all memory."""
    from tests.support import PeakMemory

    with PeakMemory() as peak, pytest.raises(ProCapError, match=f"^{name} must be"):
        generate(tmp_path / "synth", **{"scenes": 2, "size": 32, "progress": False, **arguments})
    assert peak.growth < 64 * 2**20 and not (tmp_path / "synth").exists()


# ------------------------------------------------------------------------------------------------ viewpoints


def _changed_share(a: np.ndarray, b: np.ndarray) -> float:
    """Share of pixels that differ visibly (by more than 8 of 255 in some channel)."""
    return float((np.abs(a.astype(int) - b.astype(int)).max(axis=-1) > 8).mean())


@pytest.mark.parametrize("viewpoint", ["distractor", "strong"])
def test_viewpoint_benchmarks_are_deterministic_and_hold_the_same_scenes(tmp_path, viewpoint):
    generate(tmp_path / "a", scenes=10, size=24, seed=5, progress=False, viewpoint=viewpoint)
    generate(tmp_path / "b", scenes=10, size=24, seed=5, progress=False, viewpoint=viewpoint)
    generate(tmp_path / "c", scenes=10, size=24, seed=6, progress=False, viewpoint=viewpoint)
    generate(tmp_path / "none", scenes=10, size=24, seed=5, progress=False)
    for name in ("scenes.json", "change_captions.json", "no_change_captions.json", "splits.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for index in range(10):
        for folder, pattern in (("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
            path = f"{folder}/CLEVR_{pattern}_{index:06d}.png"
            assert np.array_equal(_read(tmp_path / "a" / path), _read(tmp_path / "b" / path)), path
    jittered = json.loads((tmp_path / "a" / "scenes.json").read_text())
    other_seed = json.loads((tmp_path / "c" / "scenes.json").read_text())
    plain = json.loads((tmp_path / "none" / "scenes.json").read_text())
    assert jittered["viewpoint"] == viewpoint and plain["viewpoint"] == "none"
    assert [s["after_view"] for s in jittered["scenes"]] != [s["after_view"] for s in other_seed["scenes"]]
    # only the views differ from the seed's `none` benchmark: objects, changes, captions and splits are its own
    for with_view, without in zip(jittered["scenes"], plain["scenes"]):
        assert "after_view" in with_view and "after_view" not in without
        assert {k: v for k, v in with_view.items() if "view" not in k} == {
            k: v for k, v in without.items() if "view" not in k
        }
        assert with_view["view"] == without["view"]
    for name in ("change_captions.json", "no_change_captions.json", "splits.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "none" / name).read_bytes(), name
    before = _read(tmp_path / "a/images/CLEVR_default_000003.png")
    assert np.array_equal(before, _read(tmp_path / "none/images/CLEVR_default_000003.png"))


@pytest.mark.parametrize(("viewpoint", "moves"), [("none", False), ("distractor", True), ("strong", True)])
def test_the_semantic_pair_moves_the_view_only_with_a_viewpoint(tmp_path, viewpoint, moves):
    generate(tmp_path, scenes=10, size=32, seed=2, progress=False, viewpoint=viewpoint)
    shares = []
    for index in range(10):
        before = _read(tmp_path / f"images/CLEVR_default_{index:06d}.png")
        after = _read(tmp_path / f"sc_images/CLEVR_semantic_{index:06d}.png")
        distractor = _read(tmp_path / f"nsc_images/CLEVR_nonsemantic_{index:06d}.png")
        shares.append(_changed_share(before, after))
        if make_scene(index, seed=2, viewpoint=viewpoint).get(
            "still"
        ):  # a still distractor is the before image exactly
            assert np.array_equal(before, distractor)
        else:  # the others move the view and light
            assert _changed_share(before, distractor) > 0.3
    # Measured at 64 px over 30 scenes: without a viewpoint the change pair changes 2-13 % of the pixels (one
    # object), with one 41-99 % (the whole view), like the distractors.
    if moves:
        assert min(shares) > 0.3, shares
    else:
        assert max(shares) < 0.2, shares


def test_view_jitter_stays_in_the_issued_ranges():
    from procap.data.synthetic import DISTRACTOR_JITTER, STRONG_JITTER

    def offsets(view: dict, base: dict) -> dict[str, float]:
        return {
            "dx": view["dx"],
            "dy": view["dy"],
            "scale": view["scale"] - 1.0,
            "light": view["light"] - base["light"],
            "brightness": view["brightness"] - 1.0,
        }

    expected = {
        ("none", "distractor_view"): DISTRACTOR_JITTER,
        ("distractor", "after_view"): DISTRACTOR_JITTER,
        ("distractor", "distractor_view"): DISTRACTOR_JITTER,
        ("strong", "after_view"): STRONG_JITTER,
        ("strong", "distractor_view"): STRONG_JITTER,
    }
    assert STRONG_JITTER["dx"] == (0.03, 0.07) and STRONG_JITTER["dy"] == (0.02, 0.05)
    assert STRONG_JITTER["scale"] == (0.04, 0.10) and DISTRACTOR_JITTER["light"] == (0.3, 0.7)
    for (viewpoint, key), ranges in expected.items():
        signs = {name: set() for name in ranges}
        for index in range(200):
            scene = make_scene(index, 11, viewpoint=viewpoint)
            assert scene["view"]["dx"] == scene["view"]["dy"] == 0.0 and scene["view"]["scale"] == 1.0
            if key == "distractor_view" and scene.get("still"):  # still: the before image's view exactly
                assert scene[key] == scene["view"]
                continue
            for name, value in offsets(scene[key], scene["view"]).items():
                low, high = ranges[name]
                # views are stored rounded to 4 decimals, so a draw may land half a unit of the last place outside
                assert low - 1e-4 <= abs(value) <= high + 1e-4, (viewpoint, key, name, value)
                signs[name].add(value > 0)
        assert all(found == {True, False} for found in signs.values()), (viewpoint, key, signs)
    assert "after_view" not in make_scene(0, 11)  # `none`: the change pair keeps the before image's view


@pytest.mark.parametrize("viewpoint", ["distractor", "strong"])
def test_render_intermediate_endpoints_under_a_viewpoint(tmp_path, viewpoint):
    generate(tmp_path, scenes=5, size=32, seed=2, progress=False, viewpoint=viewpoint)
    for index in range(5):
        before = _read(tmp_path / f"images/CLEVR_default_{index:06d}.png")
        for distractor, after_path in (
            (False, f"sc_images/CLEVR_semantic_{index:06d}.png"),
            (True, f"nsc_images/CLEVR_nonsemantic_{index:06d}.png"),
        ):
            frames = [render_intermediate(tmp_path, index, t, distractor=distractor) for t in (0.0, 0.5, 1.0)]
            assert np.array_equal(frames[0], before)
            assert np.array_equal(frames[-1], _read(tmp_path / after_path))
            assert not np.array_equal(frames[1], frames[0]) and not np.array_equal(frames[1], frames[-1])


def test_a_viewpoint_outside_the_choices_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ProCapError, match="viewpoint must be one of none, distractor, strong, got 'sideways'"):
        generate(tmp_path / "out", scenes=2, size=16, seed=0, progress=False, viewpoint="sideways")
    assert not (tmp_path / "out").exists()


def test_a_share_of_the_distractors_is_still_under_every_viewpoint(tmp_path):
    """Still distractors are pixel-identical to their before image; the others are not; the share is STILL_SHARE."""
    from procap.data.synthetic import STILL_SHARE

    for viewpoint in VIEWPOINTS:
        scenes = [make_scene(i, seed=4, viewpoint=viewpoint) for i in range(400)]
        still = [s["index"] for s in scenes if s.get("still")]
        assert abs(len(still) / len(scenes) - STILL_SHARE) < 0.05, (viewpoint, len(still))
        # the same scenes are still under every viewpoint, and being still moves no object and no change
        assert still == [s["index"] for s in (make_scene(i, seed=4) for i in range(400)) if s.get("still")]
        for scene in scenes[:40]:
            before = render_state(scene, 0.0, 32)
            distractor = render_state(scene, 1.0, 32, distractor=True)
            assert np.array_equal(before, distractor) == bool(scene.get("still")), scene["index"]


_KILLED_WHILE_RENDERING = """
import os, sys
from procap.data import synthetic

save = synthetic._save_png

def save_then_die(array, path):
    save(array, path)
    os._exit(86)  # as kill -9 after the first image: no cleanup runs

synthetic._save_png = save_then_die
synthetic.generate(sys.argv[1], 4, size=16, seed=1, progress=False)
"""


def test_the_staging_folder_of_a_killed_synth_is_deleted_by_the_next(tmp_path, caplog):
    """Issue 48: a synth killed while rendering left its staging folder inside the dataset for good."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.support import subprocess_env

    root = tmp_path / "bench"
    generate(root, 4, size=16, seed=1, progress=False)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_RENDERING, str(root)],
        cwd=Path(__file__).resolve().parents[2],
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert killed.returncode == 86, killed.stderr[-3000:]
    assert len(list(root.glob(".synth-new-*"))) == 1  # what the kill left

    with caplog.at_level("WARNING", logger="procap"):  # a library note: logged, the CLI shows it on stderr
        generate(root, 4, size=16, seed=1, progress=False)
    assert not list(root.glob(".synth-new-*"))
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert "unfinished benchmark of a synth killed while writing it" in caplog.text


def test_a_second_synth_into_one_folder_is_refused(tmp_path, capsys):
    from procap.commands.cli import main
    from procap.core.files import RunFolderLock

    root = tmp_path / "bench"
    root.mkdir()
    with RunFolderLock(root):  # a synth writing the folder (the lock is per open file: this counts as another)
        with pytest.raises(ProCapError, match=f"the benchmark folder {root} is in use by another procap run"):
            generate(root, 4, size=16, seed=1, progress=False)
        assert main(["synth", "--out", str(root), "--scenes", "4", "--size", "16", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("procap: error:") and "in use by another procap run" in err and err.count("\n") == 1
    assert list(root.iterdir()) == []


def test_a_refused_synth_names_the_process_that_holds_the_folder(tmp_path, capsys):
    """The refusal says which process writes the folder (process id, command, host), as the caption file's lock
    does, where it said only "another procap run"."""
    import socket
    import subprocess
    import sys

    from procap.commands.cli import main
    from tests.support import subprocess_env

    root = tmp_path / "bench"
    root.mkdir()
    hold = (
        "import sys, time; from procap.core.files import RunFolderLock; "
        "lock = RunFolderLock(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(root)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["synth", "--out", str(root), "--scenes", "4", "--size", "16", "--no-progress"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"in use by another procap run (pid {holder.pid}: -c {root}, host {socket.gethostname()})" in err
    assert err.count("\n") == 1
    assert list(root.iterdir()) == []  # the record lies beside the folder, which a synth refuses non-empty
    assert (tmp_path / ".bench.lock").is_file()  # a killed holder's record: the next holder takes it over
    generate(root, 4, size=16, seed=1, progress=False)
    assert not (tmp_path / ".bench.lock").exists()
